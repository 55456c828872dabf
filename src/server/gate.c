/* SPDX-License-Identifier: Apache-2.0 */
#include "server/gate.h"

#include <stdio.h>
#include <string.h>

#include "server/internal.h"

static const char NOT_FOUND[] =
    "not found: GET /healthz, /health, /act, /, /status.json, /metrics; POST /act, /reset; a websocket upgrade on any path";

static void refuse(ma_gate *g, int status, int reason, const char *msg) {
    g->route = MA_R_REFUSED;
    g->status = status;
    g->reason = g->inference ? reason : -1;
    snprintf(g->msg, sizeof g->msg, "%s", msg);
}

void ma_gate_decide(const ma_gate_in *in, ma_gate *g) {
    memset(g, 0, sizeof *g);
    const char *p = in->path ? in->path : "";
    const char *m = in->method ? in->method : "";
    const int get = !strcmp(m, "GET") || !strcmp(m, "HEAD");
    const int post = !strcmp(m, "POST");
    const int upgrade = in->upgrade && !strcmp(m, "GET");
    /* the one exemption from the key and the slots: a plain GET or HEAD of a health path; an
     * upgrade there, or any other method, is decided like every other request (issue 36 F7) */
    g->health = (!strcmp(p, "/healthz") || !strcmp(p, "/health")) && get && !in->upgrade;
    g->inference = upgrade || (post && !strcmp(p, "/act"));
    if (in->reserved && !g->health) {
        refuse(g, 503, F_OVERLOADED, "server: too many clients (--max-clients); /healthz and /health are still answered");
        return;
    }
    if (!g->health && in->key != MA_KEY_RIGHT) {
        refuse(g, 401, F_UNAUTHORIZED, "missing or wrong API key (Authorization: Api-Key <key>)");
        return;
    }
    if (upgrade) {
        if (in->http10) refuse(g, 400, F_BAD_REQUEST, "a websocket upgrade needs HTTP/1.1");
        else if (in->stopping) refuse(g, 503, F_SHUTTING_DOWN, "server: shutting down");
        else g->route = MA_R_WEBSOCKET;
        return;
    }
    static const struct {
        const char *path;
        const char *allow;
        ma_route get, post;
    } R[] = {
        {"/healthz", "GET, HEAD", MA_R_HEALTHZ, MA_R_REFUSED},
        {"/health", "GET, HEAD", MA_R_HEALTH, MA_R_REFUSED},
        {"/act", "GET, HEAD, POST", MA_R_HEALTH, MA_R_ACT},
        {"/reset", "POST", MA_R_REFUSED, MA_R_RESET},
        {"/", "GET, HEAD", MA_R_PAGE, MA_R_REFUSED},
        {"/status.js", "GET, HEAD", MA_R_STATUS_JS, MA_R_REFUSED},
        {"/status.json", "GET, HEAD", MA_R_STATUS, MA_R_REFUSED},
        {"/metrics", "GET, HEAD", MA_R_METRICS, MA_R_REFUSED},
    };
    for (size_t i = 0; i < sizeof R / sizeof R[0]; i++) {
        if (strcmp(p, R[i].path)) continue;
        const ma_route r = get ? R[i].get : post ? R[i].post : MA_R_REFUSED;
        if (r == MA_R_REFUSED) {
            char msg[160];
            snprintf(msg, sizeof msg, "method %.16s is not allowed on %s (%s)", m, p, R[i].allow);
            g->allow = R[i].allow;
            refuse(g, 405, F_BAD_REQUEST, msg);
        } else if (r == MA_R_ACT && in->stopping) refuse(g, 503, F_SHUTTING_DOWN, "server: shutting down");
        else g->route = r;
        return;
    }
    refuse(g, 404, F_BAD_REQUEST, NOT_FOUND);
}

int ma_gate_key(const char *h, size_t hl, const unsigned char *key, size_t kl) {
    if (!h) return MA_KEY_ABSENT;
    size_t pl = 0;
    if (hl >= 8 && !strncmp(h, "Api-Key ", 8)) pl = 8;
    else if (hl >= 7 && !strncmp(h, "Bearer ", 7)) pl = 7;
    else return MA_KEY_WRONG;
    const unsigned char *k = (const unsigned char *)h + pl;
    const size_t n = hl - pl;
    /* every byte of the stored key is compared, whatever was sent */
    unsigned diff = n != kl;
    for (size_t i = 0; i < kl; i++) diff |= (unsigned)(key[i] ^ (i < n ? k[i] : 0));
    return diff ? MA_KEY_WRONG : MA_KEY_RIGHT;
}
