# SPDX-License-Identifier: Apache-2.0
"""molmoact pull against a Hugging Face Hub on loopback (tests/hub/fake_hub.py): the cache tree
huggingface_hub's own snapshot_download writes (recorded: tests/fixtures/hub/), a redirect to another
host that never sees the token, a dropped connection resumed in the run and by the next run, a
Range the server ignores, a wrong checksum, a body longer than its size, 401, 403, 404s, a path
the server should not send, the free-space check, --include, a tag, a renamed repo, and a LeRobot
policy pulled with its base and then run.

    MOLMOACT=build/molmoact MOLMOACT_SRC=. /usr/bin/python3 -m pytest -q tests/hub"""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fake_hub  # noqa: E402
from tree import cache_tree  # noqa: E402

BIN = os.environ.get("MOLMOACT", "build/molmoact")
SRC = os.environ.get("MOLMOACT_SRC", ".")
PY = "/usr/bin/python3"
TOKEN = "hf_secretTOKENvalue1234567890"
SNAP = "models--test-org--sample/snapshots/" + fake_hub.COMMIT

if subprocess.run([BIN, "pull", "--help"], capture_output=True).returncode != 0:
    pytest.skip("this build has no molmoact pull (no libcurl)", allow_module_level=True)


@pytest.fixture
def hub():
    h = fake_hub.Hub({"test-org/sample": fake_hub.sample_repo(), "test-org/gated": dict(fake_hub.sample_repo(), gated=True)}, token=TOKEN)
    yield h
    h.close()


def pull(hub, cache, *args, env=None, timeout=120):
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    e["HOME"] = str(cache) + "-home"  # no token file of the user's
    e.update(env or {})
    p = subprocess.run([BIN, "pull", *args, "--endpoint", hub.endpoint, "--cache-dir", str(cache)], capture_output=True, timeout=timeout, env=e)
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    assert TOKEN not in out + err
    return p.returncode, out, err


def recorded():
    with open(os.path.join(SRC, "tests/fixtures/hub/huggingface_hub_tree.txt")) as f:
        return [ln.rstrip("\n") for ln in f if not ln.startswith("#")]


def test_the_cache_is_the_one_huggingface_hub_writes(hub, tmp_path):
    c = tmp_path / "cache"
    rc, out, err = pull(hub, c, "test-org/sample")
    assert rc == 0, err
    assert out.strip() == str(c / SNAP)
    assert cache_tree(c) == recorded()
    # the run's messages: what it fetches, the progress, nothing about tokens
    assert "8 of 8 files" in err and "[8/8]" in err
    # a second pull fetches no byte: every blob is there
    n = len(hub.log)
    rc, out2, err = pull(hub, c, "test-org/sample")
    assert rc == 0 and out2 == out, err
    assert not [r for r in hub.log[n:] if r["method"] == "GET" and ("/resolve/" in r["path"] or r["cdn"])]
    assert "0 B to download" in err


def test_the_cdn_never_sees_the_token(hub, tmp_path):
    tf = tmp_path / "token"
    tf.write_text(TOKEN + "\n")
    rc, out, err = pull(hub, tmp_path / "c", "test-org/gated", "--token-file", str(tf))
    assert rc == 0, err
    api = [r for r in hub.log if not r["cdn"]]
    cdn = [r for r in hub.log if r["cdn"]]
    assert api and cdn
    assert all(r["headers"].get("Authorization") == "Bearer " + TOKEN for r in api)
    assert not [r for r in cdn if "Authorization" in r["headers"] or r["method"] == "LEAK"]
    # HF_TOKEN does the same, and HF_HOME/token (where `hf auth login` writes it)
    rc, _, err = pull(hub, tmp_path / "c2", "test-org/gated", env={"HF_TOKEN": TOKEN})
    assert rc == 0, err
    home = tmp_path / "hfhome"
    home.mkdir()
    (home / "token").write_text(TOKEN)
    rc, _, err = pull(hub, tmp_path / "c3", "test-org/gated", env={"HF_HOME": str(home)})
    assert rc == 0, err


@pytest.mark.parametrize("token, code, needle", [(None, "401", "needs a token"), ("hf_wrong", "403", "token was refused")])
def test_a_gated_repo_without_the_right_token(hub, tmp_path, token, code, needle):
    env = {"HF_TOKEN": token} if token else {}
    rc, out, err = pull(hub, tmp_path / "c", "test-org/gated", env=env)
    assert rc == 1 and out == ""
    assert "HTTP " + code in err and "GatedRepo" in err and needle in err, err
    assert "hf_wrong" not in err


@pytest.mark.parametrize("repo, needle", [("test-org/nothing", "RepoNotFound"), ("test-org/sample@nobranch", "RevisionNotFound")])
def test_not_found(hub, tmp_path, repo, needle):
    rc, out, err = pull(hub, tmp_path / "c", repo)
    assert rc == 1 and "HTTP 404" in err and needle in err, err
    assert not (tmp_path / "c" / "models--test-org--nothing").exists()


def test_a_dropped_connection_is_resumed_in_the_run(hub, tmp_path):
    hub.faults["drop"] = [1, 1 << 20]
    rc, out, err = pull(hub, tmp_path / "c", "test-org/sample")
    assert rc == 0, err
    assert "trying again" in err
    ranges = [r["headers"].get("Range") for r in hub.log if r["cdn"] and r["method"] == "GET"]
    assert "bytes=%d-" % (1 << 20) in ranges, ranges
    assert cache_tree(tmp_path / "c") == recorded()


def test_a_partial_blob_is_kept_and_resumed_by_the_next_run(hub, tmp_path):
    c = tmp_path / "c"
    hub.faults["drop"] = [1, 1 << 20]
    rc, out, err = pull(hub, c, "test-org/sample", "--retries", "0")
    assert rc == 1 and "kept: the same command resumes it" in err, err
    part = [p for p in (c / "models--test-org--sample/blobs").iterdir() if p.name.endswith(".incomplete")]
    assert len(part) == 1 and part[0].stat().st_size == 1 << 20
    rc, out, err = pull(hub, c, "test-org/sample", "--retries", "0")
    assert rc == 0 and "resuming after 1048576" in err, err
    assert cache_tree(c) == recorded()


def test_a_range_the_server_ignores_starts_over(hub, tmp_path):
    c = tmp_path / "c"
    hub.faults["drop"] = [1, 100000]
    assert pull(hub, c, "test-org/sample", "--retries", "0")[0] == 1
    hub.faults["ignore_range"] = True
    rc, out, err = pull(hub, c, "test-org/sample")
    assert rc == 0, err
    assert cache_tree(c) == recorded()


def test_a_wrong_checksum_is_refused(hub, tmp_path):
    c = tmp_path / "c"
    hub.faults["corrupt"] = True
    rc, out, err = pull(hub, c, "test-org/sample")
    assert rc == 1 and "SHA-256" in err and "not kept" in err, err
    blobs = c / "models--test-org--sample/blobs"
    assert not [p for p in blobs.iterdir() if len(p.name) >= 64], "a corrupt blob was kept"
    assert not (c / SNAP / "model.safetensors").exists()


def test_a_body_longer_than_its_size_is_refused(hub, tmp_path):
    hub.faults["extra"] = True
    rc, out, err = pull(hub, tmp_path / "c", "test-org/sample")
    assert rc == 1 and "more than the" in err, err


@pytest.mark.parametrize("evil", ["../../outside.txt", "/etc/passwd", "a/../../b", "sub//x", "a\\b", "x\ny"])
def test_a_path_the_server_should_not_send(hub, tmp_path, evil):
    hub.faults["evil_path"] = evil
    c = tmp_path / "c"
    rc, out, err = pull(hub, c, "test-org/sample")
    assert rc == 1 and "refused" in err, err
    assert not (tmp_path / "outside.txt").exists()
    assert not [r for r in hub.log if r["method"] == "GET" and "/resolve/" in r["path"]], "downloads began before every name was checked"


def test_the_free_space_is_checked_first(hub, tmp_path):
    rc, out, err = pull(hub, tmp_path / "c", "test-org/sample", "--min-free-mb", "1e11")
    assert rc == 1 and "free" in err and "nothing was downloaded" in err, err
    assert not [r for r in hub.log if r["method"] in ("GET", "HEAD") and ("/resolve/" in r["path"] or r["cdn"])]


def test_include_tag_and_a_renamed_repo(hub, tmp_path):
    c = tmp_path / "c"
    rc, out, err = pull(hub, c, "test-org/sample@v1", "--include", "*.json", "--include", "sub/dir/")
    assert rc == 0, err
    snap = c / SNAP
    assert sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if not p.is_dir()) == ["config.json", "sub/dir/notes.txt", "tokenizer.json"]
    assert (c / "models--test-org--sample/refs/v1").read_text() == fake_hub.COMMIT
    rc, out, err = pull(hub, c, "test-org/sample", "--include", "*.nothing")
    assert rc == 1 and "matches --include" in err
    hub.faults["renamed"] = {"test-org/old-name": "test-org/sample"}
    rc, out, err = pull(hub, c, "test-org/old-name", "--include", "config.json")
    assert rc == 0, err
    assert (c / "models--test-org--old-name/snapshots" / fake_hub.COMMIT / "config.json").is_symlink()


@pytest.mark.parametrize("args, needle", [(["not-a-repo"], "not a repo id"), (["a/b/c"], "more than one '/'"),
                                         (["test-org/sample@../x"], "revision"), (["test-org/sample", "--endpoint", "ftp://x"], "http")])
def test_bad_arguments(hub, tmp_path, args, needle):
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    p = subprocess.run([BIN, "pull", "--cache-dir", str(tmp_path), *args] + ([] if "--endpoint" in args else ["--endpoint", hub.endpoint]),
                       capture_output=True, timeout=60, env=e)
    assert p.returncode == 1 and needle in p.stderr.decode(), p.stderr
    assert not hub.log


def test_a_lerobot_policy_comes_with_its_base_and_runs(tmp_path):
    """the path a robot engineer takes: a policy id to a cache to actions (the tiny demo model as
    the base repo, a policy saved in LeRobot's layout by reference/make_lerobot.py)"""
    pol = tmp_path / "policy"
    subprocess.run([PY, os.path.join(SRC, "reference/make_lerobot.py"), "--model", os.path.join(SRC, "assets/tiny-grid/model"), "-o",
                    str(pol), "--effective", str(tmp_path / "eff"), "--repo-id", "test-org/tiny-grid"],
                   check=True, capture_output=True, timeout=300)
    base = fake_hub.repo_from_dir(os.path.join(SRC, "assets/tiny-grid/model"))
    h = fake_hub.Hub({"test-org/tiny-policy": fake_hub.repo_from_dir(str(pol)), "test-org/tiny-grid": base})
    try:
        c = tmp_path / "cache"
        rc, out, err = pull(h, c, "test-org/tiny-policy")
        assert rc == 0, err
        assert "its base test-org/tiny-grid" in err
        bsnap = c / "models--test-org--tiny-grid/snapshots" / fake_hub.COMMIT
        got = sorted(p.name for p in bsnap.iterdir())
        assert "config.json" in got and "tokenizer.json" in got
        assert not [n for n in got if n.endswith(".safetensors")], "the base's weights were fetched: a policy carries its own"
        e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MOLMOACT_BASE"))}
        e["HF_HUB_CACHE"] = str(c)
        p = subprocess.run([BIN, "run", "--model", out.strip(), "--inproc", "--image0", os.path.join(SRC, "assets/samples/agent.png"),
                            "--image1", os.path.join(SRC, "assets/samples/wrist.png"), "--task", "put the bowl on the plate",
                            "--state", "0,0,0,0,0,0,0,0", "--json"], capture_output=True, timeout=300, env=e)
        assert p.returncode == 0, p.stderr.decode()
        assert '"actions"' in p.stdout.decode()
    finally:
        h.close()


def test_readme_real_model_recipe_runs_as_written(tmp_path):
    """the README's "Run the real model" block pasted into a shell, against a Hub on loopback that
    serves the tiny demo checkpoint under the real repo id (serve is left out: tests/server)"""
    import re
    readme = open(os.path.join(SRC, "README.md"), encoding="utf-8").read()
    m = re.search(r"<!-- recipe: real -->\s*```sh\n(.*?)```", readme, re.S)
    assert m, "README has no recipe real"
    lines = m.group(1).replace("\\\n", " ").splitlines()
    assert any(" serve " in ln for ln in lines)
    script = "\n".join(ln for ln in lines if " serve " not in ln).replace("build/molmoact", os.path.abspath(BIN))
    h = fake_hub.Hub({"allenai/MolmoAct2-LIBERO": fake_hub.repo_from_dir(os.path.join(SRC, "assets/tiny-grid/model"))})
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MOLMOACT"))}
        env.update(HOME=str(tmp_path), HF_ENDPOINT=h.endpoint)
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=SRC, capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 0 and "action chunk [10, 7]" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
        assert (tmp_path / ".cache/huggingface/hub/models--allenai--MolmoAct2-LIBERO/refs/main").exists()
    finally:
        h.close()


def test_progress_on_a_terminal_is_one_redrawn_line(hub, tmp_path):
    """on a terminal (script(1) gives it one) the progress redraws one line: bytes, rate, percent"""
    import shlex
    cmd = " ".join(shlex.quote(x) for x in [os.path.abspath(BIN), "pull", "test-org/sample", "--endpoint", hub.endpoint, "--cache-dir",
                                            str(tmp_path / "c")])
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    p = subprocess.run(["script", "-qfec", cmd, "/dev/null"], capture_output=True, timeout=120, env=e)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, out
    assert "\r\x1b[K[8/8]" in out and "(100%)" in out and "B/s" in out, repr(out[-600:])
    assert "pull: [" not in out  # the plain lines are for logs, not terminals


def test_a_symlink_in_the_cache_is_not_written_through(hub, tmp_path):
    """a shared cache may hold another user's links: a planted blobs/<etag>.incomplete link is not
    followed (its target keeps its bytes)"""
    c = tmp_path / "c"
    blobs = c / "models--test-org--sample/blobs"
    blobs.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    import hashlib
    sha = hashlib.sha256(fake_hub.sample_repo()["files"]["model.safetensors"]).hexdigest()
    os.symlink(victim, blobs / (sha + ".incomplete"))
    rc, out, err = pull(hub, c, "test-org/sample")
    assert rc == 1 and "symbolic link" in err, err
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("fault, value, needle", [("huge", 1030, "more than 1 EB"), ("same_id", True, "different sizes"),
                                                  ("loop_page", True, "cannot progress")])
def test_a_listing_that_cannot_be_right_is_refused(hub, tmp_path, fault, value, needle):
    hub.faults[fault] = value
    hub.faults["page"] = 2000 if fault == "huge" else fake_hub.PAGE
    rc, out, err = pull(hub, tmp_path / "c", "test-org/sample")
    assert rc == 1 and needle in err, err
    assert not [r for r in hub.log if r["cdn"]]


def test_a_busy_hub_is_asked_again(hub, tmp_path):
    hub.faults["api_503"] = [2]
    rc, out, err = pull(hub, tmp_path / "c", "test-org/sample")
    assert rc == 0 and err.count("HTTP 503; trying again") == 2, err
    assert cache_tree(tmp_path / "c") == recorded()


def test_a_wrong_partial_file_from_an_earlier_run_is_fetched_again(hub, tmp_path):
    c = tmp_path / "c"
    hub.faults["drop"] = [1, 1 << 20]
    assert pull(hub, c, "test-org/sample", "--retries", "0")[0] == 1
    part = next(p for p in (c / "models--test-org--sample/blobs").iterdir() if p.name.endswith(".incomplete"))
    part.write_bytes(b"\0" * (1 << 20))  # bytes that are not the file's
    rc, out, err = pull(hub, c, "test-org/sample")
    assert rc == 0 and "fetching it again from the start" in err, err
    assert cache_tree(c) == recorded()


def test_the_token_file_under_xdg_cache_home(hub, tmp_path):
    xdg = tmp_path / "xdg"
    (xdg / "huggingface").mkdir(parents=True)
    (xdg / "huggingface/token").write_text(TOKEN)
    rc, _, err = pull(hub, tmp_path / "c", "test-org/gated", env={"XDG_CACHE_HOME": str(xdg)})
    assert rc == 0, err
