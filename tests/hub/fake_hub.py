# SPDX-License-Identifier: Apache-2.0
"""A Hugging Face Hub on loopback for molmoact pull's tests, written from what huggingface_hub's
client expects of the Hub (huggingface/huggingface_hub at ee0a4510f4bc15e26cb722be2efc2bdb01383ca0:
hf_api.py model_info and list_repo_tree, utils/_pagination.py, file_download.py
get_hf_file_metadata and http_get), not from molmoact's code:

  GET  /api/models/ORG/NAME/revision/REV   {"id", "sha", "siblings": [{"rfilename"}]}
  GET  /api/models/ORG/NAME/tree/REV?recursive=true   a JSON array of {"type", "oid", "size", "path",
       "lfs": {"oid", "size", "pointerSize"}}, PAGE entries a page, the next page in a Link header
  HEAD /ORG/NAME/resolve/REV/PATH          X-Repo-Commit; a plain file: 200, ETag (its git blob id),
       Content-Length; an LFS file: 302 to the CDN (another host name on loopback), X-Linked-Etag (its
       SHA-256), X-Linked-Size
  GET  the same: the body (Range honoured), or the 302
  GET  CDN /blobs/SHA256?X-Amz-Signature=...: the body (Range honoured)

Errors as the Hub sends them (X-Error-Code: RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo).
Faults on demand (hub.faults): "drop": [N, BYTES] the CDN closes the connection after BYTES of the
next N bodies; "corrupt": the CDN flips a byte; "extra": the CDN sends more than the size;
"ignore_range": the CDN answers a Range with the whole body; "evil_path": the listing names a path;
"huge": N LFS files of 8.99e15 bytes listed; "same_id": a file listed again under another path with
the same LFS id and another size; "loop_page": each page's Link names itself; "page": N entries a page (default PAGE); "api_503": [N] the
next N API requests answered 503.
Every request is recorded (method, host, path, headers) in hub.log.

Run alone (for huggingface_hub's snapshot_download by hand):
    /usr/bin/python3 tests/hub/fake_hub.py      # prints the endpoint, serves until killed
"""
import hashlib
import http.server
import json
import random
import socketserver
import threading
import urllib.parse

COMMIT = hashlib.sha1(b"molmoact fake hub commit 1").hexdigest()
OLD_COMMIT = hashlib.sha1(b"molmoact fake hub commit 0").hexdigest()
PAGE = 3


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data):
    return b"version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (hashlib.sha256(data).hexdigest().encode(), len(data))


def sample_repo():
    """a small repo of fixed bytes: plain JSON files, nested paths, two LFS files (one stored twice)"""
    rng = random.Random(1234)
    weights = bytes(rng.getrandbits(8) for _ in range(3 << 20))
    other = bytes(rng.getrandbits(8) for _ in range(200 << 10))
    files = {
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n",
        "README.md": b"# a test repo\n",
        "config.json": json.dumps({"model_type": "test", "hidden_size": 8}).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
        "model.safetensors": weights,
        "sub/dir/notes.txt": b"nested\n",
        "sub/copy.bin": other,
        "sub/again.bin": other,
    }
    return {"files": files, "lfs": {"model.safetensors", "sub/copy.bin", "sub/again.bin"}}


def repo_from_dir(path, lfs_suffixes=(".safetensors", ".gguf", ".bin", ".npz")):
    import os
    files = {}
    for root, _, names in os.walk(path):
        for n in names:
            full = os.path.join(root, n)
            rel = os.path.relpath(full, path)
            with open(full, "rb") as f:
                files[rel] = f.read()
    return {"files": files, "lfs": {p for p in files if p.endswith(lfs_suffixes)}}


class Hub:
    def __init__(self, repos, token=None):
        """repos: {"ORG/NAME": sample_repo()-like dicts (gated: True for a token-only repo)}"""
        self.repos = repos
        self.token = token
        self.faults = {}
        self.log = []
        self.lock = threading.Lock()
        self.api = _server(self, "127.0.0.1", cdn=False)
        self.cdn = _server(self, "127.0.0.2", cdn=True)
        self.endpoint = "http://127.0.0.1:%d" % self.api.server_address[1]
        self.cdn_base = "http://127.0.0.2:%d" % self.cdn.server_address[1]
        for s in (self.api, self.cdn):
            threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        for s in (self.api, self.cdn):
            s.shutdown()
            s.server_close()

    def blobs(self):
        out = {}
        for r in self.repos.values():
            for p, d in r["files"].items():
                if p in r["lfs"]:
                    out[hashlib.sha256(d).hexdigest()] = d
        return out

    def entries(self, repo):
        r = self.repos[repo]
        out, dirs = [], set()
        for p in sorted(r["files"]):
            d = r["files"][p]
            parts = p.split("/")
            for i in range(1, len(parts)):
                dirs.add("/".join(parts[:i]))
            e = {"type": "file", "size": len(d), "path": p}
            if p in r["lfs"]:
                ptr = lfs_pointer(d)
                e["oid"] = git_blob_id(ptr)
                e["lfs"] = {"oid": hashlib.sha256(d).hexdigest(), "size": len(d), "pointerSize": len(ptr)}
            else:
                e["oid"] = git_blob_id(d)
            out.append(e)
        for d in sorted(dirs):
            out.append({"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d})
        if "evil_path" in self.faults:
            out.append({"type": "file", "oid": git_blob_id(b"x"), "size": 1, "path": self.faults["evil_path"]})
        for i in range(self.faults.get("huge", 0)):
            out.append({"type": "file", "oid": "%040x" % i, "size": 8990000000000000, "path": "huge/%d.bin" % i,
                        "lfs": {"oid": "%064x" % i, "size": 8990000000000000, "pointerSize": 134}})
        if "same_id" in self.faults:
            e = dict(next(x for x in out if "lfs" in x))
            e["path"], e["lfs"] = "zz_again.bin", dict(e["lfs"], size=e["lfs"]["size"] + 1)
            out.append(e)
        return out


def _server(hub, host, cdn):
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def record(self):
            with hub.lock:
                hub.log.append({"method": self.command, "cdn": cdn, "path": self.path, "headers": dict(self.headers)})

        def reply(self, code, body=b"", headers=(), head=False):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def error(self, code, xcode, msg, head=False, extra=()):
            body = json.dumps({"error": msg}).encode()
            self.reply(code, body, [("Content-Type", "application/json"), ("X-Error-Code", xcode), ("X-Error-Message", msg), *extra], head)

        def authorized(self, repo):
            if not hub.repos[repo].get("gated"):
                return None
            got = self.headers.get("Authorization")
            if got is None:
                return (401, "GatedRepo", "Access to model %s is restricted. You must have access to it and be authenticated." % repo)
            if got != "Bearer %s" % hub.token:
                return (403, "GatedRepo", "Access to model %s is restricted and you are not in the authorized list." % repo)
            return None

        def body(self, data, head, extra=()):
            rng = self.headers.get("Range")
            f = hub.faults
            start = 0
            if rng and not f.get("ignore_range"):
                start = int(rng.split("=")[1].split("-")[0])
                part = data[start:]
                hdr = [("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data))), ("Accept-Ranges", "bytes"), *extra]
                code = 206
            else:
                part, hdr, code = data, [("Accept-Ranges", "bytes"), *extra], 200
            if cdn and f.get("corrupt") and part:
                part = bytes([part[0] ^ 0xFF]) + part[1:]
            if cdn and f.get("extra"):
                part = part + b"more than the size"
            drop = f.get("drop")
            if cdn and drop and drop[0] > 0 and not head:
                drop[0] -= 1
                self.send_response(code)
                for k, v in hdr:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                self.wfile.write(part[: drop[1]])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.reply(code, part, hdr, head)

        def do_HEAD(self):
            self.handle_any(head=True)

        def do_GET(self):
            self.handle_any(head=False)

        def handle_any(self, head):
            self.record()
            u = urllib.parse.urlsplit(self.path)
            path = urllib.parse.unquote(u.path)
            if cdn:
                if self.headers.get("Authorization"):
                    with hub.lock:
                        hub.log.append({"method": "LEAK", "cdn": True, "path": self.path, "headers": {}})
                sha = path.rsplit("/", 1)[-1]
                data = hub.blobs().get(sha)
                if data is None:
                    return self.error(404, "EntryNotFound", "no such blob", head)
                return self.body(data, head)
            parts = path.strip("/").split("/")
            api = parts[0] == "api"
            busy = hub.faults.get("api_503")
            if busy and busy[0] > 0 and (api or parts[2:3] == ["resolve"]):
                busy[0] -= 1
                return self.error(503, "ServiceUnavailable", "try again", head)
            if api:
                if len(parts) < 6 or parts[1] != "models":
                    return self.error(404, "RepoNotFound", "not an API route", head)
                repo, kind, rest = "/".join(parts[2:4]), parts[4], parts[5:]
            else:
                if len(parts) < 5 or parts[2] != "resolve":
                    return self.error(404, "RepoNotFound", "not a route", head)
                repo, kind, rest = "/".join(parts[0:2]), "resolve", parts[3:]
            if repo in hub.faults.get("renamed", {}):  # a renamed repo: a relative redirect, as the Hub sends
                new = hub.faults["renamed"][repo]
                loc = urllib.parse.quote(self.path.replace(repo, new, 1), safe="/?=&%")
                return self.reply(307, b"", [("Location", loc)], head)
            if repo not in hub.repos:
                return self.error(404, "RepoNotFound", "Repository Not Found for url: %s." % self.path, head)
            denied = self.authorized(repo)
            if denied:
                return self.error(denied[0], denied[1], denied[2], head)
            r = hub.repos[repo]
            refs = {"main": COMMIT, "v1": OLD_COMMIT if r.get("old") else COMMIT, COMMIT: COMMIT}
            rev = urllib.parse.unquote(rest[0])
            if rev not in refs:
                return self.error(404, "RevisionNotFound", "Invalid rev id: %s" % rev, head)
            commit = refs[rev]
            if kind == "revision":
                return self.reply(200, json.dumps({"id": repo, "sha": commit, "siblings": [{"rfilename": p} for p in sorted(r["files"])]}).encode(),
                                  [("Content-Type", "application/json")], head)
            if kind == "tree":
                q = urllib.parse.parse_qs(u.query)
                entries = hub.entries(repo)
                if q.get("recursive") != ["true"]:
                    entries = [e for e in entries if "/" not in e["path"]]
                cursor = int(q.get("cursor", ["0"])[0])
                size = hub.faults.get("page", PAGE)
                page = entries[cursor:cursor + size]
                hdr = [("Content-Type", "application/json")]
                if hub.faults.get("loop_page"):
                    hdr.append(("Link", '<%s>; rel="next"' % self.path))
                elif cursor + size < len(entries):
                    nq = dict((k, v[0]) for k, v in q.items())
                    nq["cursor"] = str(cursor + size)
                    hdr.append(("Link", '<%s%s?%s>; rel="next"' % (hub.endpoint, u.path, urllib.parse.urlencode(nq))))
                return self.reply(200, json.dumps(page).encode(), hdr, head)
            if kind != "resolve":
                return self.error(404, "RepoNotFound", "no such route", head)
            fpath = "/".join(urllib.parse.unquote(p) for p in rest[1:])
            data = r["files"].get(fpath)
            if data is None:
                return self.error(404, "EntryNotFound", "%s does not exist at %s" % (fpath, commit), head, [("X-Repo-Commit", commit)])
            if fpath in r["lfs"]:
                sha = hashlib.sha256(data).hexdigest()
                loc = "%s/blobs/%s?X-Amz-Signature=%s&response-content-disposition=attachment" % (hub.cdn_base, sha, sha[:16])
                return self.reply(302, b"", [("Location", loc), ("X-Repo-Commit", commit), ("X-Linked-Etag", '"%s"' % sha),
                                             ("X-Linked-Size", str(len(data))), ("ETag", '"%s"' % git_blob_id(lfs_pointer(data)))], head)
            return self.body(data, head, [("X-Repo-Commit", commit), ("ETag", '"%s"' % git_blob_id(data))])

    class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    return S((host, 0), H)


if __name__ == "__main__":
    import time
    h = Hub({"test-org/sample": sample_repo()})
    print(h.endpoint, flush=True)
    while True:
        time.sleep(3600)
