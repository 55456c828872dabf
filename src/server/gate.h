/* SPDX-License-Identifier: Apache-2.0 */
/* The one decision on every HTTP request and every websocket upgrade, made once when its head is
 * complete: which route serves it, or why it is refused (the API key, the health-check slots beyond
 * --max-clients, the drain, a method a path does not allow, an unknown path). A pure function:
 * tests/server/test_gate.c enumerates every path x method x upgrade x key x slot. */
#ifndef MA_SERVER_GATE_H
#define MA_SERVER_GATE_H

#include <stddef.h>

typedef enum {
    MA_R_REFUSED, /* answered with status and msg */
    MA_R_HEALTHZ,
    MA_R_HEALTH,    /* GET /health and GET /act: the health JSON */
    MA_R_ACT,       /* POST /act: an inference request */
    MA_R_RESET,     /* POST /reset */
    MA_R_PAGE,      /* GET / */
    MA_R_STATUS_JS, /* GET /status.js */
    MA_R_STATUS,    /* GET /status.json */
    MA_R_METRICS,   /* GET /metrics */
    MA_R_WEBSOCKET  /* a websocket upgrade (any path) */
} ma_route;

enum { MA_KEY_ABSENT, MA_KEY_WRONG, MA_KEY_RIGHT }; /* a server without a key sees MA_KEY_RIGHT */

typedef struct ma_gate_in {
    const char *method; /* as sent */
    const char *path;   /* without the query */
    int http10;         /* HTTP/1.0 */
    int upgrade;        /* Upgrade: websocket with Connection: upgrade */
    int key;            /* MA_KEY_* */
    int reserved;       /* the connection holds a health-check slot (beyond --max-clients) */
    int stopping;       /* the server is draining */
} ma_gate_in;

typedef struct ma_gate {
    ma_route route;
    int status;        /* refused: the HTTP status */
    int reason;        /* refused: the failure reason (F_*) when it is an inference request, else -1 */
    int inference;     /* POST /act or an upgrade: counted in /metrics when refused */
    int health;        /* the exemption: a plain GET or HEAD of /healthz or /health */
    const char *allow; /* 405: the Allow header's value */
    char msg[160];     /* refused: what the client is told */
} ma_gate;

void ma_gate_decide(const ma_gate_in *in, ma_gate *out);

/* the Authorization header against the key (constant time in the key's length):
 * "Api-Key KEY" or "Bearer KEY"; returns MA_KEY_* */
int ma_gate_key(const char *header, size_t header_len, const unsigned char *key, size_t key_len);

#endif
