/* SPDX-License-Identifier: Apache-2.0 */
/* The environment variables molmoact reads: one table (name, the deployment's older name kept as
 * an alias, what reads it, what it means, and the settings field it fills), from which `molmoact
 * help env`, each command's help and the README's table are printed, and from which
 * ma_settings_from_env fills a settings struct (core/settings.h). That function is the one place
 * the library reads the environment; nothing in it writes the environment.
 *
 * New names carry the MOLMOACT_ prefix; the reference deployment's VISION_CTX_SUFFIX,
 * LLM_CTX_SUFFIX, ACTION_CTX_SUFFIX and MOLMOACT2_PROMPT_SEQ are read as aliases of
 * MOLMOACT_VISION_CTX_SUFFIX, ... and MOLMOACT_PROMPT_SEQ. */
#ifndef MA_ENV_H
#define MA_ENV_H

#include "core/error.h"
#include "core/settings.h"

typedef enum { MA_SET_NONE, MA_SET_STR, MA_SET_INT, MA_SET_FLAG } ma_setting_type;

typedef struct {
    const char *name;  /* MOLMOACT_...; NULL for a setting no variable fills (the table's tail) */
    const char *alias; /* the older name read as well, or NULL */
    const char *value; /* its values, for the help: "N", "DIR", ... */
    const char *who;   /* what reads it: commands, "library", "python" */
    const char *help;
    /* the settings field it fills (NULL: read by someone else, e.g. the Python binding) */
    const char *key;
    ma_setting_type type;
    size_t off, size;    /* the field in ma_settings */
    long lo, hi;         /* an integer's range */
    const char *choices; /* a string's values, '|'-separated, or NULL for any */
} ma_env_var;

extern const ma_env_var MA_ENV_VARS[];
extern const int MA_ENV_COUNT;

/* the settings the environment gives, over ma_settings_init's defaults: every row with a key, the
 * alias contradictions refused, the hub cache resolved as huggingface_hub does */
ma_status ma_settings_from_env(ma_settings *s, ma_error *err);

/* a variable of the table read by its own reader (key NULL: the token of molmoact pull, ...);
 * NULL when unset or when name is not in the table */
const char *ma_env_get(const char *name);

/* the Hugging Face home as huggingface_hub resolves it (constants.py HF_HOME): $HF_HOME, else
 * $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface; 0 when none is known */
int ma_env_hf_home(char *out, size_t cap);

/* a number written plainly in decimal, as the command line and the environment take them: an
 * optional '-', digits and, when real, an optional fraction and exponent (1.5, -2, 1e-9); no
 * spaces, '+' sign, hexadecimal, inf or nan. 1 when s is one */
int ma_plain_decimal(const char *s, int real);

#endif
