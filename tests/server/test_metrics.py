# SPDX-License-Identifier: Apache-2.0
"""`molmoact serve`'s statistics: GET /metrics in Prometheus' text exposition format 0.0.4 (read by a
strict parser written here, and by prometheus_client's own parser), the status page's p50/p90/p99
and 1-2-5 axis ticks, and a port conflict reported in one line.

    MOLMOACT=build/molmoact /usr/bin/python3 -m pytest -q tests/server/test_metrics.py"""
import asyncio
import http.client
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from test_server import BIN, Server, curl, free_port, model, observation, oc

HISTORY = 64  # the status page's ring (server.c)
REASONS = {"bad_request", "too_large", "timeout", "unauthorized", "overloaded", "shutting_down", "worker", "internal", "protocol"}
COMPONENTS = {"queue", "decode", "preprocess", "vision", "llm_split0", "llm_split1", "llm_split2", "llm_split3", "action_context",
              "action_step", "transfer", "host", "total"}
CTYPE = "text/plain; version=0.0.4; charset=utf-8"

# ------------------------------------------------------------------------------------ a strict parser

METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
VALUE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]Inf|NaN")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse_value(tok):
    assert VALUE.fullmatch(tok), f"not a float: {tok!r}"
    return float(tok.replace("Inf", "inf"))


def parse_labels(s, i):
    """s[i] == '{': the labels up to the matching '}' -> (dict, index after '}')"""
    assert s[i] == "{"
    i += 1
    labels = {}
    while s[i] != "}":
        m = LABEL.match(s, i)
        assert m, f"label name expected at {i}: {s!r}"
        name = m.group()
        assert not name.startswith("__"), f"reserved label name {name}"
        assert name not in labels, f"label {name} twice: {s!r}"
        i = m.end()
        assert s[i:i + 2] == '="', f"'=\"' expected after label {name}: {s!r}"
        i += 2
        v = []
        while s[i] != '"':
            if s[i] == "\\":
                esc = s[i + 1]
                assert esc in '\\"n', f"bad escape \\{esc} in {s!r}"
                v.append("\n" if esc == "n" else esc)
                i += 2
            else:
                assert s[i] != "\n"
                v.append(s[i])
                i += 1
        labels[name] = "".join(v)
        i += 1
        if s[i] == ",":
            i += 1
        else:
            assert s[i] == "}", f"',' or '}}' expected at {i}: {s!r}"
    return labels, i + 1


def family_of(sample, types):
    """the family a sample name belongs to: itself, or a histogram's name for _bucket/_sum/_count"""
    for suffix in ("_bucket", "_sum", "_count"):
        base = sample[: -len(suffix)]
        if sample.endswith(suffix) and types.get(base) == "histogram":
            return base
    return sample


def parse_exposition(text):
    """Prometheus' text format 0.0.4, strictly: every line a HELP, a TYPE or a sample (no blank lines,
    no other comments, no timestamps); HELP and TYPE once per family and before its samples; a
    family's samples together; no sample twice. -> {family: {"type", "help", "samples": [(name, labels, value)]}}"""
    assert text.endswith("\n") and "\r" not in text
    fams, types, done, current = {}, {}, set(), None
    for line in text[:-1].split("\n"):
        assert line, "an empty line"
        if line.startswith("#"):
            m = re.fullmatch(r"# (HELP|TYPE) (\S+) (.+)", line)
            assert m, f"a comment that is neither HELP nor TYPE: {line!r}"
            kind, name, rest = m.groups()
            assert METRIC.fullmatch(name), name
            f = fams.setdefault(name, {"type": None, "help": None, "samples": []})
            assert not f["samples"] and name not in done, f"{kind} of {name} after its samples"
            if kind == "HELP":
                assert f["help"] is None, f"two HELP lines for {name}"
                assert re.fullmatch(r"(?:[^\\]|\\[\\n])*", rest), f"bad escape in HELP {rest!r}"
                f["help"] = rest
            else:
                assert f["type"] is None and rest in TYPES, (name, rest)
                f["type"] = types[name] = rest
            continue
        m = METRIC.match(line)
        assert m, f"no metric name: {line!r}"
        name, i = m.group(), m.end()
        labels = {}
        if i < len(line) and line[i] == "{":
            labels, i = parse_labels(line, i)
        assert line[i] == " " and " " not in line[i + 1:], f"'name{{labels}} value' expected (no timestamp): {line!r}"
        value = parse_value(line[i + 1:])
        fam = family_of(name, types)
        assert fam in types, f"sample {name} before the TYPE of its family"
        if fam != current:
            assert fam not in done, f"the samples of {fam} are not together"
            if current:
                done.add(current)
            current = fam
        f = fams[fam]
        key = (name, tuple(sorted(labels.items())))
        assert key not in {(n, tuple(sorted(l.items()))) for n, l, _ in f["samples"]}, f"sample twice: {line!r}"
        if f["type"] == "histogram":
            assert name != fam, f"a histogram's bare name as a sample: {line!r}"
            assert ("le" in labels) == name.endswith("_bucket"), line
        f["samples"].append((name, labels, value))
    for name, f in fams.items():
        assert f["help"] and f["type"], f"{name}: HELP and TYPE both expected"
        assert name.startswith("molmoact_"), name
        if f["type"] == "counter":
            assert name.endswith("_total"), f"counter {name} does not end in _total"
        else:
            assert not name.endswith("_total"), f"{f['type']} {name} ends in _total"
        if f["type"] == "histogram":
            check_histogram(name, f["samples"])
    return fams


def check_histogram(name, samples):
    series = {}
    for n, labels, v in samples:
        rest = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
        s = series.setdefault(rest, {"buckets": [], "sum": None, "count": None})
        if n == name + "_bucket":
            s["buckets"].append((labels["le"], v))
        elif n == name + "_sum":
            s["sum"] = v
        else:
            s["count"] = v
    bounds = None
    for rest, s in series.items():
        les = [le for le, _ in s["buckets"]]
        assert s["sum"] is not None and s["count"] is not None, (name, rest)
        assert les and les[-1] == "+Inf", (name, rest, les)
        nums = [parse_value(le) for le in les]
        assert all(a < b for a, b in zip(nums, nums[1:])), f"{name}{rest}: le not increasing: {les}"
        counts = [v for _, v in s["buckets"]]
        assert all(c == int(c) and c >= 0 for c in counts), counts
        assert all(a <= b for a, b in zip(counts, counts[1:])), f"{name}{rest}: buckets not cumulative: {counts}"
        assert counts[-1] == s["count"], f"{name}{rest}: +Inf bucket {counts[-1]} != _count {s['count']}"
        assert s["sum"] >= 0 and (s["count"] or s["sum"] == 0)
        assert bounds is None or les == bounds, f"{name}: buckets differ between series"
        bounds = les
        if name.endswith("_seconds"):
            assert nums[0] <= 0.01 and 60 in nums, f"{name}: buckets should span 0.01 s .. 60 s: {les}"
        else:  # a delay in control ticks
            assert name == "molmoact_delay_ticks" and nums[0] == 0 and 50 in nums, f"{name}: buckets should span 0 .. 50 ticks: {les}"


def sample(fams, fam, name=None, **labels):
    got = [v for n, l, v in fams[fam]["samples"] if n == (name or fam) and l == labels]
    assert len(got) == 1, (fam, name, labels, got)
    return got[0]


def scrape(srv, key=None):
    """GET /metrics -> (families by the strict parser, the raw text); also read by prometheus_client's parser"""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request("GET", "/metrics", headers={"Authorization": f"Api-Key {key}"} if key else {})
    r = conn.getresponse()
    body = r.read()
    conn.close()
    assert r.status == 200, (r.status, body)
    assert r.getheader("Content-Type") == CTYPE, r.getheader("Content-Type")
    text = body.decode("utf-8")
    fams = parse_exposition(text)
    cross_check_with_prometheus_client(text, fams)
    return fams, text


def cross_check_with_prometheus_client(text, fams):
    """prometheus_client (python3-prometheus-client) reads the same families and values"""
    from prometheus_client.parser import text_string_to_metric_families
    theirs = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            theirs[(s.name, tuple(sorted(s.labels.items())))] = s.value
            assert s.timestamp is None
    ours = {(n, tuple(sorted(l.items()))): v for f in fams.values() for n, l, v in f["samples"]}
    assert set(theirs) == set(ours), set(theirs) ^ set(ours)
    for k, v in ours.items():
        assert theirs[k] == v or (math.isnan(v) and math.isnan(theirs[k])), (k, v, theirs[k])
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert types["molmoact_requests"] == "counter" and types["molmoact_request_duration_seconds"] == "histogram"


def counters(fams):
    req = {l["protocol"]: v for n, l, v in fams["molmoact_requests_total"]["samples"]}
    fail = {l["reason"]: v for n, l, v in fams["molmoact_request_failures_total"]["samples"]}
    return req, fail


def ws_infer(uri, obs):
    async def go():
        async with oc.Client(uri) as c:
            return await c.infer(obs)
    return asyncio.run(go())


def post_act(srv, body, key=None):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    hdr = {"Content-Type": "application/json"}
    if key:
        hdr["Authorization"] = f"Api-Key {key}"
    conn.request("POST", "/act", body=body, headers=hdr)
    r = conn.getresponse()
    out = r.status, r.read()
    conn.close()
    return out


def http_act_body():
    from test_server import IMG_PNG, PROMPT, STATE, json_numpy, png_pixels
    img = png_pixels(IMG_PNG)
    return json.dumps({"image": json_numpy(img), "wrist_image": json_numpy(img), "state": json_numpy(STATE), "instruction": PROMPT})


# ------------------------------------------------------------------------------------ /metrics

def test_metrics_count_every_request_exactly():
    s = Server("tiny-grid")
    try:
        t0 = time.time()
        before, text = scrape(s)
        assert text.count("# TYPE ") == len(before)
        req0, fail0 = counters(before)
        assert set(req0) == {"http", "websocket", "grpc"} and set(fail0) == REASONS  # every label value from the start
        comp = {l["component"] for n, l, v in before["molmoact_component_duration_seconds"]["samples"]}
        assert comp == COMPONENTS, comp
        # two successes and two failures over each protocol
        assert post_act(s, http_act_body())[0] == 200
        assert post_act(s, http_act_body())[0] == 200
        code, body = post_act(s, "{not json")
        assert code == 400
        code, body = post_act(s, json.dumps({"instruction": "x"}))
        assert code == 400
        assert ws_infer(s.uri, observation())["actions"].shape == (10, 7)
        assert ws_infer(s.uri, observation())["actions"].shape == (10, 7)
        from test_server import fault
        assert fault(s.uri, b"\xc1 not msgpack")[0] == "error"
        assert fault(s.uri, b"hello", text=True)[0] == "error"
        time.sleep(0.2)
        after, _ = scrape(s)
        req1, fail1 = counters(after)
        assert req1["http"] - req0["http"] == 4 and req1["websocket"] - req0["websocket"] == 4, (req0, req1)
        assert fail1["bad_request"] - fail0["bad_request"] == 4, (fail0, fail1)
        assert all(fail1[r] == fail0[r] for r in REASONS - {"bad_request"}), (fail0, fail1)
        h = "molmoact_request_duration_seconds"
        assert sample(after, h, h + "_count") - sample(before, h, h + "_count") == 8
        assert sample(after, h, h + "_sum") > sample(before, h, h + "_sum")
        c = "molmoact_component_duration_seconds"
        for k in COMPONENTS:  # the four successes only
            assert sample(after, c, c + "_count", component=k) - sample(before, c, c + "_count", component=k) == 4, k
        assert sample(after, c, c + "_sum", component="vision") > 0 and sample(after, c, c + "_sum", component="total") > 0
        # the total's +Inf bucket and its count agree (checked for every series by the parser); the
        # engine's total is at least the vision's
        assert sample(after, c, c + "_sum", component="total") >= sample(after, c, c + "_sum", component="vision")
        # gauges
        info = [l for n, l, v in after["molmoact_info"]["samples"] if v == 1]
        assert len(info) == 1 and info[0]["variant"] == "grid" and info[0]["backend"] == "cpu" and info[0]["version"]
        assert info[0]["model"] == "tiny-grid"
        assert sample(after, "molmoact_connected_clients") >= 1  # this scrape's own connection
        assert sample(after, "molmoact_queue_depth") == 0 and sample(after, "molmoact_requests_processing") == 0
        start = sample(after, "molmoact_start_time_seconds")
        assert t0 - 130 < start <= time.time()
        assert sample(after, "molmoact_uptime_seconds") > sample(before, "molmoact_uptime_seconds")
        prec = {l["component"]: l for n, l, v in after["molmoact_component_precision_info"]["samples"]}
        assert set(prec) == {"vision", "embed", "llm_split0", "llm_split1", "llm_split2", "llm_split3", "action_context", "action_step"}
        assert all(l["precision"] == "checkpoint" and l["dtype"] == "f16" for l in prec.values()), prec
        # HEAD, other methods
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        conn.request("HEAD", "/metrics")
        r = conn.getresponse()
        assert r.status == 200 and r.read() == b"" and r.getheader("Content-Type") == CTYPE
        conn.close()
        code, body = curl("-X", "POST", "--data-binary", "x", f"{s.http}/metrics")
        assert code == 405
        # the counters and histograms are the server's life, not the status page's ring of 64
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        for _ in range(HISTORY + 6):
            conn.request("POST", "/act", body="[]")
            r = conn.getresponse()
            r.read()
            assert r.status == 400
        conn.close()
        time.sleep(0.2)
        last, _ = scrape(s)
        req2, fail2 = counters(last)
        assert req2["http"] - req1["http"] == HISTORY + 6 and fail2["bad_request"] - fail1["bad_request"] == HISTORY + 6
        assert sample(last, h, h + "_count") - sample(after, h, h + "_count") == HISTORY + 6
        code, body = curl(f"{s.http}/status.json")
        st = json.loads(body)
        assert len(st["recent"]) == HISTORY and st["requests_failed"] == sum(fail2.values())
        assert st["requests_served"] + st["requests_failed"] == sum(req2.values())
    finally:
        assert s.stop() == 0


def test_metrics_need_the_api_key_and_count_refusals(tmp_path):
    key = tmp_path / "key"
    key.write_text("k3y\n")
    s = Server("tiny-grid", "--api-key-file", str(key))
    try:
        code, body = curl(f"{s.http}/metrics")
        assert code == 401 and "API key" in json.loads(body)["error"]
        code, _ = curl("-H", "Authorization: Api-Key wrong", f"{s.http}/metrics")
        assert code == 401
        before, _ = scrape(s, key="k3y")
        assert post_act(s, http_act_body())[0] == 401
        assert post_act(s, http_act_body(), key="k3y")[0] == 200
        after, _ = scrape(s, key="k3y")
        req0, fail0 = counters(before)
        req1, fail1 = counters(after)
        assert req1["http"] - req0["http"] == 2 and fail1["unauthorized"] - fail0["unauthorized"] == 1, (req1, fail1)
        assert curl(f"{s.http}/healthz") == (200, "OK")  # health checks still need no key
    finally:
        assert s.stop() == 0


def test_metrics_label_values_escaped(tmp_path):
    name = 'we"ird\\name'
    d = tmp_path / name
    shutil.copytree(model("tiny-grid"), d)
    port = free_port()
    log = open(tmp_path / "log", "w+")
    p = subprocess.Popen([BIN, "serve", "--model", str(d), "--port", str(port)], stderr=log, stdout=subprocess.DEVNULL)
    try:
        srv = type("S", (), {"port": port})()
        for _ in range(600):
            assert p.poll() is None, open(tmp_path / "log").read()
            try:
                fams, text = scrape(srv)
                break
            except OSError:
                time.sleep(0.1)
        assert 'model="we\\"ird\\\\name"' in text
        assert [l["model"] for n, l, v in fams["molmoact_info"]["samples"]] == [name]
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0


# ------------------------------------------------------------------------------------ the status page's numbers

def nearest_rank(values, p):
    v = sorted(values)
    k = max(1, -(-p * len(v) // 100))  # ceil(p / 100 * n), exactly
    return v[k - 1]


def test_status_percentiles_from_the_history():
    s = Server("tiny-grid")
    try:
        async def go():
            async with oc.Client(s.uri) as c:
                for _ in range(13):
                    await c.infer(observation())
        asyncio.run(go())
        assert post_act(s, "{bad")[0] == 400
        code, body = curl(f"{s.http}/status.json")
        st = json.loads(body)
        ok = [r for r in st["recent"] if r["ok"]]
        failed = [r for r in st["recent"] if not r["ok"]]
        assert len(ok) == 13 and st["percentiles_over"] == 13
        assert len(failed) == 1 and failed[0]["reason"] == "bad_request" and failed[0]["protocol"] == "http"
        keys = ["request", "queue", "decode", "preprocess", "vision", "llm_split0", "llm_split1", "llm_split2", "llm_split3", "llm",
                "action_context", "action_step", "transfer", "host", "total"]
        assert list(st["percentiles"]) == keys
        for k in keys:
            vals = [r[k] for r in ok]
            for p in (50, 90, 99):
                assert st["percentiles"][k][f"p{p}"] == nearest_rank(vals, p), (k, p, vals, st["percentiles"][k])
            assert st["percentiles"][k]["p50"] <= st["percentiles"][k]["p90"] <= st["percentiles"][k]["p99"]
        for r in ok:
            assert abs(r["llm"] - sum(r[f"llm_split{i}"] for i in range(4))) < 1e-9 and r["total"] > 0 and r["request"] > 0
        assert st["failures"] == {"bad_request": 1}
        comps = {c["name"]: c for c in st["components"]}
        assert list(comps) == ["vision", "embed", "llm_split0", "llm_split1", "llm_split2", "llm_split3", "action_context", "action_step"]
        for c in comps.values():
            assert c["precision"] == "checkpoint" and c["dtype"] == "f16" and list(c["bytes"]) == ["f16"] and c["bytes"]["f16"] > 0
    finally:
        assert s.stop() == 0


def test_precision_of_a_compiled_model(tmp_path):
    """a context directory: each component's precision from its context, its dtypes with their bytes"""
    ctx = tmp_path / "ctx"
    p = subprocess.run([BIN, "compile", model("tiny-grid"), "-o", str(ctx), "--vision", "f16", "--llm", "q8_0", "--action", "bf16"],
                       capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr.decode()
    port = free_port()
    log = open(tmp_path / "log", "w+")
    proc = subprocess.Popen([BIN, "serve", "--model", str(ctx), "--port", str(port)], stderr=log, stdout=subprocess.DEVNULL)
    try:
        for _ in range(600):
            assert proc.poll() is None, open(tmp_path / "log").read()
            try:
                code, body = curl(f"http://127.0.0.1:{port}/status.json")
                if code == 200:
                    break
            except Exception:
                pass
            time.sleep(0.1)
        comps = {c["name"]: c for c in json.loads(body)["components"]}
        want = {"vision": "f16", "llm_split0": "q8_0", "llm_split3": "q8_0", "action_step": "bf16"}
        for k, prec in want.items():
            assert comps[k]["precision"] == prec, comps[k]
            assert comps[k]["dtype"] == prec and comps[k]["bytes"][prec] > 0, comps[k]
        assert "f32" in comps["vision"]["bytes"]  # vectors are stored in f32
        srv = type("S", (), {"port": port})()
        fams, _ = scrape(srv)
        prec = {l["component"]: (l["precision"], l["dtype"]) for n, l, v in fams["molmoact_component_precision_info"]["samples"]}
        assert prec["llm_split1"] == ("q8_0", "q8_0") and prec["vision"] == ("f16", "f16"), prec
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_axis_ticks_read_well():
    """niceTicks of /status.js, run in node: steps of 1, 2 or 5 times a power of ten, 0 to the first
    tick at or above the maximum, 2 to 5 intervals, labels with the step's decimals"""
    node = shutil.which("node")
    if not node:
        pytest.fail("node is not installed (scripts/install_test_deps.sh installs it)")
    s = Server("tiny-grid")
    try:
        code, js = curl(f"{s.http}/status.js")
        assert code == 200
    finally:
        assert s.stop() == 0
    maxima = [0, 1e-4, 0.0123, 0.3, 0.999, 1, 1.01, 3.7, 9.99, 10, 12.5, 47, 99, 100, 101, 250, 733.3, 1234, 50000, 987654]
    prog = ("const vm=require('vm');const ctx={fetch:()=>new Promise(()=>{}),setInterval:()=>0,Math:Math,Number:Number,console:console};"
            "vm.createContext(ctx);vm.runInContext(require('fs').readFileSync(0,'utf8'),ctx);"
            f"console.log(JSON.stringify({json.dumps(maxima)}.map(m=>ctx.niceTicks(m))))")
    p = subprocess.run([node, "-e", prog], input=js.encode(), capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    for m, t in zip(maxima, json.loads(p.stdout)):
        step, top, labels = t["step"], t["top"], t["labels"]
        e = math.floor(math.log10(step) + 1e-9)
        mant = step / 10 ** e
        assert any(abs(mant - x) < 1e-9 for x in (1, 2, 5)), (m, step)
        assert top >= max(m, 1e-300) * (1 - 1e-12) and (m == 0 or top - step < m), (m, t)
        assert 2 <= len(labels) - 1 <= 5 or m == 0, (m, labels)
        dec = max(0, -e)
        assert labels == [f"{i * step:.{dec}f}" for i in range(len(labels))], (m, labels)
        assert all(abs(float(l) - i * step) < step * 1e-6 for i, l in enumerate(labels)), (m, labels)


# ------------------------------------------------------------------------------------ a port conflict

PORT_LINE = r"molmoact serve: port {port} is already in use on 127\.0\.0\.1 \(another server\?\); choose another with --port"


def test_port_in_use_is_one_clear_line():
    s = Server("tiny-grid")
    try:
        p = subprocess.run([BIN, "serve", "--model", model("tiny-grid"), "--port", str(s.port)], capture_output=True, timeout=120)
        err = p.stderr.decode()
        assert p.returncode != 0 and p.stdout == b""
        assert err.endswith("\n") and len(err.splitlines()) == 1, err
        assert re.fullmatch(PORT_LINE.format(port=s.port), err.rstrip("\n")), err
        code, body = curl(f"{s.http}/healthz")
        assert (code, body) == (200, "OK")  # the first one is untouched
    finally:
        assert s.stop() == 0


def test_port_conflict_while_the_first_is_loading(tmp_path):
    """two servers started at once: both bind before either listens (the port opens once the model is
    loaded); the second fails at once with the same one line, without loading the model"""
    port = free_port()
    cmd = [BIN, "serve", "--model", model("tiny-grid"), "--port", str(port)]
    logs = [open(tmp_path / f"{i}.log", "w+") for i in range(2)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=logs[i]) for i in range(2)]
    try:
        deadline = time.time() + 120
        while all(p.poll() is None for p in procs) and time.time() < deadline:
            time.sleep(0.05)
        gone = [i for i, p in enumerate(procs) if p.poll() is not None]
        assert len(gone) == 1, "exactly one of the two must fail"
        loser, winner = gone[0], 1 - gone[0]
        assert procs[loser].returncode != 0
        err = open(tmp_path / f"{loser}.log").read()
        assert len(err.splitlines()) == 1 and re.fullmatch(PORT_LINE.format(port=port), err.rstrip("\n")), err
        while time.time() < deadline:
            assert procs[winner].poll() is None, open(tmp_path / f"{winner}.log").read()
            try:
                if curl(f"http://127.0.0.1:{port}/healthz") == (200, "OK"):
                    break
            except Exception:
                pass
            time.sleep(0.1)
        assert curl(f"http://127.0.0.1:{port}/healthz") == (200, "OK")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                assert p.wait(timeout=60) == 0
