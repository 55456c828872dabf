/* SPDX-License-Identifier: Apache-2.0 */
/* The environment variables molmoact reads: one table (name, the deployment's older name kept as
 * an alias, what reads it, what it means), from which `molmoact help env`, each command's help and
 * the README's table are printed. New names carry the MOLMOACT_ prefix; the reference
 * deployment's VISION_CTX_SUFFIX, LLM_CTX_SUFFIX, ACTION_CTX_SUFFIX and MOLMOACT2_PROMPT_SEQ are
 * read as aliases of MOLMOACT_VISION_CTX_SUFFIX, ... and MOLMOACT_PROMPT_SEQ. */
#ifndef MA_ENV_H
#define MA_ENV_H

#include "core/error.h"

typedef struct {
    const char *name;  /* MOLMOACT_... */
    const char *alias; /* the older name read as well, or NULL */
    const char *value; /* its values, for the help: "N", "DIR", ... */
    const char *who;   /* what reads it: commands, "library", "python" */
    const char *help;
} ma_env_var;

extern const ma_env_var MA_ENV_VARS[];
extern const int MA_ENV_COUNT;

/* the value of a table variable: its MOLMOACT_ name, else its alias; NULL when neither is set */
const char *ma_env(const char *name);

/* the name the value of ma_env(name) was read from (name, or its alias when only that is set) */
const char *ma_env_source(const char *name);

/* a variable set under both names with different values: refused, naming both */
ma_status ma_env_check_aliases(ma_error *err);

/* a switch such as MOLMOACT_PRELOAD: on when set to anything but "" or "0" */
int ma_env_flag(const char *name);

/* the context suffixes (MOLMOACT_VISION_CTX_SUFFIX, _LLM_, _ACTION_ and their older names) name
 * files inside the model directory: a '/', "." or "..", or more than 64 characters, refused */
ma_status ma_env_check_suffixes(ma_error *err);

/* a number written plainly in decimal, as the command line and the environment take them: an
 * optional '-', digits and, when real, an optional fraction and exponent (1.5, -2, 1e-9); no
 * spaces, '+' sign, hexadecimal, inf or nan. 1 when s is one */
int ma_plain_decimal(const char *s, int real);

#endif
