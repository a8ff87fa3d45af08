"""kvtier-replay against the independent oracle, its invariants in every configuration, its
outputs, and its handling of bad input. Run by ctest with KVTIER_REPLAY set to the binary."""
import csv
import json
import os
import random
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPLAY = os.environ.get("KVTIER_REPLAY", str(ROOT / "build" / "bin" / "kvtier-replay"))
ORACLE = ROOT / "tools" / "replay" / "oracle.py"
TRACE = ROOT / "examples" / "traces" / "conversation_trace.jsonl"
TINY = ["--chunk-bytes", "64", "--no-progress"]


def replay(*args, check=True):
    p = subprocess.run([REPLAY, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert p.returncode >= 0, f"killed by signal {-p.returncode}: {p.stderr}"
    if check:
        assert p.returncode == 0, p.stderr
    return p


def replay_json(*args):
    return json.loads(replay(*args, "--json").stdout)


def oracle(trace, capacities):
    out = subprocess.run([sys.executable, ORACLE, trace, *map(str, capacities)],
                         capture_output=True, text=True, check=True).stdout
    return {int(k): v for k, v in json.loads(out).items()}


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    """Requests that share prefixes of different lengths, like conversations and few-shot
    prompts, with ids drawn so that equal ids always follow equal prefixes."""
    rng = random.Random(7)
    prefixes, next_id, lines = [[]], 0, []
    for i in range(400):
        base = list(rng.choice(prefixes))
        base = base[: rng.randint(0, min(len(base), 18))]  # chains of at most 30 blocks
        tail = list(range(next_id, next_id + rng.randint(1, 12)))
        next_id += len(tail)
        chain = base + tail
        prefixes.append(chain)
        lines.append(json.dumps({"timestamp": i * 50, "input_length": 512 * len(chain),
                                 "output_length": 1, "hash_ids": chain}))
    path = tmp_path_factory.mktemp("trace") / "small.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def check_invariants(r):
    assert r["g1_hit_blocks"] + r["g2_hit_blocks"] + r["g3_hit_blocks"] + r["g4_hit_blocks"] \
        + r["miss_blocks"] == r["blocks"]
    assert r["mismatched_blocks"] == 0
    assert r["verified_blocks"] == r["onboarded_blocks"]
    assert r["failed_transfers"] == 0


@pytest.mark.parametrize("capacity", [300, 4000, 20000, 200000])
def test_g1_hits_equal_the_oracle_on_the_shipped_trace(capacity):
    r = replay_json("--trace", TRACE, "--g1-blocks", capacity, "--g2-blocks", 0,
                    "--g3-blocks", 0, *TINY)
    assert r["requests"] == 12031 and r["blocks"] == 288500
    assert r["g1_hit_blocks"] == oracle(TRACE, [capacity])[capacity]
    check_invariants(r)


def test_g1_hits_equal_the_oracle_on_a_generated_trace(small_trace):
    capacities = [30, 40, 150, 600, 5000]
    want = oracle(small_trace, capacities)
    assert len(set(want.values())) > 2, "the trace should tell capacities apart"
    for c in capacities:
        r = replay_json("--trace", small_trace, "--g1-blocks", c, "--g2-blocks", 0,
                        "--g3-blocks", 0, *TINY)
        assert r["g1_hit_blocks"] == want[c], c


@pytest.mark.parametrize("extra", [
    ["--offload", "eager"],
    ["--offload", "lazy"],
    ["--offload", "eager", "--concurrency", "4"],
    ["--offload", "lazy", "--concurrency", "3"],
    ["--policy", "frequency:2"],
    ["--g2-blocks", "0"],
    ["--g3-blocks", "0", "--offload", "lazy"],
])
def test_three_tiers_move_real_bytes_and_verify_them(small_trace, tmp_path, extra):
    args = ["--trace", small_trace, "--g1-blocks", 40, "--g2-blocks", 120, "--g3-blocks", 400,
            "--layers", 2, "--chunk-bytes", 4096, "--g3-path", tmp_path, "--no-progress", *extra]
    r = replay_json(*args)
    check_invariants(r)
    assert r["requests"] == 400
    if "--concurrency" not in extra and "frequency:2" not in extra:
        lower = r["g2_hit_blocks"] + r["g3_hit_blocks"]
        assert lower > 0, "a G1 this small must send some hits to the lower tiers"
        assert r["onboarded_blocks"] == lower
    assert r["offloaded_blocks"] > 0
    assert list(tmp_path.iterdir()) == [], "the G3 file must be gone after the run"


def test_the_summary_names_every_number(small_trace):
    out = replay("--trace", small_trace, "--g1-blocks", 40, "--g2-blocks", 100,
                 "--g3-blocks", 300, "--no-progress").stdout
    for word in ["hits", "G1", "G2", "G3", "misses", "G1->G2", "G2->G1", "GB/s", "verified",
                 "0 mismatched", "wall"]:
        assert word in out, word


def test_timeline_and_plot(small_trace, tmp_path):
    csv_path, svg_path = tmp_path / "t.csv", tmp_path / "p.svg"
    r = replay_json("--trace", small_trace, "--g1-blocks", 40, "--g2-blocks", 100,
                    "--g3-blocks", 0, "--interval", 2, "--timeline", csv_path,
                    "--plot", svg_path, *TINY)
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == 10  # 400 requests 50 ms apart in 2 s intervals
    assert sum(int(x["requests"]) for x in rows) == 400
    assert sum(int(x["blocks"]) for x in rows) == r["blocks"]
    for x in rows:
        assert 0 <= float(x["hit_rate"]) <= 1
    root = ET.parse(svg_path).getroot()
    assert root.tag.endswith("svg")
    assert len(root.findall("{http://www.w3.org/2000/svg}polygon")) == 3


@pytest.mark.parametrize("args, message", [
    (["--trace", "/nonexistent/trace.jsonl"], "cannot open"),
    (["--g1-blocks", "-5"], "--g1-blocks must be in 1.."),
    (["--g2-blocks", "-1"], "--g2-blocks must be in 0.."),
    (["--g3-blocks", "99999999999"], "--g3-blocks must be in 0.."),
    (["--g1-blocks", "0"], "--g1-blocks must be in 1.."),
    (["--g1-blocks", "10"], "G1 is smaller than one request: the request on line"),
    (["--g1-blocks", "60000000", "--chunk-bytes", "1048576"], "host memory"),
    (["--concurrency", "0"], "--concurrency must be in"),
    (["--offload", "sometimes"], "--offload must be eager or lazy"),
    (["--policy", "frequency:x"], "--policy frequency:N"),
    (["--policy", "lru"], "--policy must be presence or frequency:N"),
    (["--page-size", "300"], "page_size"),
    (["--g1-blocks", "abc"], "g1-blocks"),
    (["--mode", "batch"], "--mode must be blocks or engine"),
    (["--mode", "engine", "--concurrency", "2"], "apply to --mode blocks only"),
    (["--mode", "engine", "--chunk-bytes", "0"], "--mode engine needs --chunk-bytes > 0"),
    (["--mode", "engine", "--g2-blocks", "0", "--g3-blocks", "0"], "needs G2 or G3"),
    (["--mode", "engine", "--token-budget", "0"], "--token-budget must be in 1.."),
    (["--mode", "engine", "--max-running", "0"], "--max-running must be in 1.."),
    (["--mode", "engine", "--g1-blocks", "200"], "G1 is smaller than one request"),
    (["--mode", "engine", "--g4", "redis://127.0.0.1:1"], "--g4 apply to --mode blocks only"),
    (["--layer-forward-us", "10"], "apply to --mode engine only"),
    (["--mode", "engine", "--layer-forward-us", "-1"], "--layer-forward-us must be in 0.."),
    (["--g4", "http://127.0.0.1:1"], "g4_url"),
    (["--g1-memory", "gpu"], "--g1-memory must be host or cuda"),
    (["--cuda-copy", "dma"], "--cuda-copy must be batched, per-chunk, kernel or auto"),
])
def test_bad_arguments_fail_cleanly(args, message):
    if "--trace" not in args:
        args = ["--trace", TRACE, *args]
    p = replay(*args, "--no-progress", check=False)
    assert p.returncode > 0
    assert message in p.stderr, p.stderr


@pytest.mark.parametrize("content, line", [
    ('{"timestamp": 0, "hash_ids": [1, 2]}\n{"timestamp": 1, "hash_ids": [1, 2\n', 2),
    ('{"timestamp": 0, "hash_ids": [1]}\n\n[1, 2]\n', 3),
    ('{"timestamp": 0, "hash_ids": [-1]}\n', 1),
    ('{"timestamp": 0, "hash_ids": [99999999999]}\n', 1),
    ('{"timestamp": "soon", "hash_ids": [1]}\n', 1),
    ('{"timestamp": 0}\n', 1),
])
def test_malformed_lines_are_named(tmp_path, content, line):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    p = replay("--trace", path, *TINY, check=False)
    assert p.returncode > 0
    assert f"bad.jsonl:{line}:" in p.stderr, p.stderr


def test_empty_trace(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    p = replay("--trace", path, *TINY, check=False)
    assert p.returncode > 0 and "no requests" in p.stderr


# --- --mode engine: the trace through the connector, G1 owned by a simulated engine ---

BLOCKS_KEYS = ["trace", "requests", "blocks", "g1_hit_blocks", "g2_hit_blocks", "g3_hit_blocks",
               "g3_recovered_blocks", "g4_hit_blocks", "g4_stored_blocks", "g4_failed_blocks",
               "miss_blocks", "hit_rate", "offloaded_blocks", "onboarded_blocks",
               "verified_blocks", "mismatched_blocks", "cancelled_transfers",
               "failed_transfers", "transfers", "alloc_waits", "seconds", "prefault_seconds",
               "config"]


def check_engine(r, requests):
    assert r["mode"] == "engine" and r["requests"] == requests
    assert r["mismatched_blocks"] == 0
    assert r["load_error_blocks"] == 0 and r["store_failures"] == 0
    assert r["loaded_tokens"] > 0 and r["stored_blocks"] > 0
    assert r["verified_blocks"] * r["config"]["page_size"] == r["loaded_tokens"]
    assert r["prefill_tokens_saved"] == r["loaded_tokens"]
    t = r["slot_transitions"]
    assert t["NONE->INITIALIZED"] == requests
    assert sum(v for k, v in t.items() if k.endswith("->FINISHED")) == requests
    assert t["ONBOARD_STAGED->ONBOARDING"] == t["ONBOARDING->PREFILLING"] > 0
    assert sum(v for k, v in t.items() if k.endswith("->PREEMPTED")) == r["preemptions"]
    assert all("UNKNOWN" not in k for k in t)


def test_engine_mode_replays_the_shipped_trace():
    """The whole trace at the default capacities: every request runs to its output_length,
    and every prompt or output token is computed, hit in the engine's G1 or loaded, once
    (the last sampled token of each request is never computed)."""
    r = replay_json("--trace", TRACE, "--mode", "engine", *TINY)
    check_engine(r, 12031)
    assert r["preemptions"] == 0, "at these capacities G1 holds every running request"
    assert r["output_tokens"] == 4122048 and r["prompt_tokens"] == 144793823
    assert r["computed_tokens"] + r["g1_hit_tokens"] + r["prefill_tokens_saved"] == \
        r["prompt_tokens"] + r["output_tokens"] - r["requests"]
    assert r["steps"] >= r["computed_tokens"] / r["config"]["token_budget"]
    assert r["g1_hit_tokens"] > 0


@pytest.fixture(scope="module")
def shipped_prefix(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "prefix.jsonl"
    with open(TRACE) as f:
        path.write_text("".join(line for _, line in zip(range(2000), f)))
    return path


@pytest.mark.parametrize("extra", [
    ["--offload", "eager"],
    ["--offload", "lazy"],
    ["--g2-blocks", "0"],  # stores go to G3, loads come from G3
])
def test_engine_mode_preempts_and_resumes_through_the_connector(shipped_prefix, tmp_path,
                                                                extra):
    """A G1 of 400 blocks for 32 running requests: the youngest are preempted, resume
    through get_num_new_matched_tokens, and load what they had stored."""
    r = replay_json("--trace", shipped_prefix, "--mode", "engine", "--g1-blocks", 400,
                    "--g2-blocks", 3000, "--g3-blocks", 6000, "--max-running", 32,
                    "--g3-path", tmp_path, *TINY, *extra)
    check_engine(r, 2000)
    assert r["preemptions"] > 0
    assert r["slot_transitions"].get("PREEMPTED->ONBOARD_STAGED", 0) > 0, \
        "some preempted requests must come back through a load"
    assert list(tmp_path.iterdir()) == [], "the G3 file must be gone after the run"


@pytest.mark.parametrize("extra", [[], ["--g2-blocks", "0"]])
def test_engine_mode_times_its_layered_steps_against_the_bare_forwards(shipped_prefix, tmp_path,
                                                                        extra):
    """Issue 23: a forward of 4 layers, each written before its wait_for_layer_load and busy
    for --layer-forward-us, then saved; the loaded blocks still verify whole, and
    --compare-bare times the same steps without the connector."""
    r = replay_json("--trace", shipped_prefix, "--mode", "engine", "--g1-blocks", 400,
                    "--g2-blocks", 3000, "--g3-blocks", 6000, "--max-running", 32,
                    "--g3-path", tmp_path, "--layers", 4, "--layer-forward-us", 20,
                    "--compare-bare", *TINY, *extra)
    check_engine(r, 2000)
    assert r["config"]["layer_forward_us"] == 20
    step, bare = r["step_wall_us"], r["bare_step_wall_us"]
    assert bare["median"] >= 4 * 20 and step["median"] >= 4 * 20
    assert step["mean"] > 0 and bare["mean"] > 0


def test_engine_mode_summary(shipped_prefix):
    out = replay("--trace", shipped_prefix, "--mode", "engine", "--g1-blocks", 400,
                 "--max-running", 32, "--no-progress", "--chunk-bytes", 64).stdout
    for word in ["--mode engine", "steps", "preemptions", "loaded", "stored", "0 mismatched",
                 "wall"]:
        assert word in out, word


def test_blocks_mode_is_the_default_and_unchanged(small_trace):
    """--mode blocks is today's replay: the same keys in the same order, and the same
    counts with and without the flag (G1 only, so that nothing depends on copy timing)."""
    args = ["--trace", small_trace, "--g1-blocks", 40, "--g2-blocks", 0, "--g3-blocks", 0,
            *TINY]
    default, blocks = replay_json(*args), replay_json(*args, "--mode", "blocks")
    assert list(default) == BLOCKS_KEYS
    for r in (default, blocks):
        del r["seconds"], r["prefault_seconds"]
    assert default == blocks


def test_g3_keep_reuses_the_file_and_the_second_run_hits_g3(small_trace, tmp_path):
    args = ["--trace", small_trace, "--g1-blocks", 200, "--g2-blocks", 0, "--g3-blocks", 4000,
            "--layers", 2, "--chunk-bytes", 4096, "--g3-path", tmp_path, "--g3-keep",
            "--no-progress"]
    first = replay_json(*args)
    check_invariants(first)
    assert first["g3_recovered_blocks"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["kvtier-g3.bin"]
    second = replay_json(*args)
    check_invariants(second)
    # G3 holds every block the first run computed: the second run computes none again.
    assert 0 < second["g3_recovered_blocks"] <= first["miss_blocks"]
    assert second["miss_blocks"] == 0, second
    assert second["g3_hit_blocks"] > first["g3_hit_blocks"]
    assert second["mismatched_blocks"] == 0 and second["verified_blocks"] > 0


def test_g3_keep_needs_a_path():
    p = replay("--trace", TRACE, "--g3-keep", "--no-progress", check=False)
    assert p.returncode > 0
    assert "--g3-keep needs --g3-path" in p.stderr, p.stderr


# --- --g4: a G4 on Redis shared by two replays ---

@pytest.fixture
def redis_url(tmp_path):
    """A real redis-server on 127.0.0.1 and a free port, in tmp_path; the test fails (never
    skips) without one: it is a dependency (tools/install-deps.sh)."""
    import shutil
    import socket
    import time
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    assert os.access(binary, os.X_OK), "redis-server not found: install redis-server"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir",
                             str(tmp_path), "--save", "", "--appendonly", "no", "--logfile",
                             str(tmp_path / "redis.log")])
    try:
        deadline = time.time() + 5
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, "redis-server did not start"
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def test_g4_is_off_by_default(small_trace):
    r = replay_json("--trace", small_trace, *TINY)
    assert r["g4_hit_blocks"] == r["g4_stored_blocks"] == r["g4_failed_blocks"] == 0


@pytest.mark.parametrize("offload", ["eager", "lazy"])
def test_a_second_replay_hits_what_the_first_stored_in_g4(small_trace, redis_url, offload):
    """Two replays with G1 and G2 only, one after the other, share G4: the second finds in
    G4 what the first computed and verifies every byte it onboards from there."""
    args = ["--trace", small_trace, "--g1-blocks", 40, "--g2-blocks", 40, "--g3-blocks", 0,
            "--layers", 2, "--chunk-bytes", 1024, "--offload", offload, "--g4", redis_url,
            "--no-progress"]
    first = replay_json(*args)
    check_invariants(first)
    assert first["g4_stored_blocks"] > 0 and first["g4_failed_blocks"] == 0
    second = replay_json(*args)
    check_invariants(second)
    assert second["g4_hit_blocks"] > 0, second
    assert second["g4_hit_blocks"] > first["g4_hit_blocks"]
    assert second["miss_blocks"] < first["miss_blocks"]
    assert second["verified_blocks"] >= second["g4_hit_blocks"]
    assert second["mismatched_blocks"] == 0



# --- --g1-memory cuda: G1 in device memory (a GPU run; skipped loudly without one) ---

def cuda_replay_json(*args):
    p = replay(*args, "--g1-memory", "cuda", "--json", check=False)
    no_gpu = ["built without CUDA", "no CUDA device"]
    if p.returncode != 0 and any(m in p.stderr for m in no_gpu):
        pytest.skip(f"SKIPPED: --g1-memory cuda needs a CUDA device: {p.stderr.strip()}")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_engine_json_reports_the_workers_transfers(shipped_prefix):
    r = replay_json("--trace", shipped_prefix, "--mode", "engine", "--g1-blocks", 400,
                    "--max-running", 32, *TINY)
    assert r["config"]["g1_memory"] == "host"
    g1g2, g2g1 = r["transfers"]["G1->G2"], r["transfers"]["G2->G1"]
    assert g1g2["blocks"] == r["stored_blocks"] > 0
    assert g2g1["blocks"] == r["verified_blocks"] > 0
    assert g2g1["gb_per_s"] > 0 and r["failed_transfers"] == 0


def test_blocks_mode_with_g1_in_cuda_memory(small_trace, tmp_path):
    r = cuda_replay_json("--trace", small_trace, "--g1-blocks", 200, "--g2-blocks", 300,
                         "--g3-blocks", 4000, "--g3-path", tmp_path, "--chunk-bytes", 4096,
                         "--no-progress")
    check_invariants(r)
    assert r["config"]["g1_memory"] == "cuda"
    assert r["g2_hit_blocks"] > 0 and r["g3_hit_blocks"] > 0
    assert r["transfers"]["G1->G2"]["gb_per_s"] > 0


def test_engine_mode_with_g1_in_cuda_memory(shipped_prefix, tmp_path):
    r = cuda_replay_json("--trace", shipped_prefix, "--mode", "engine", "--g1-blocks", 400,
                         "--g2-blocks", 3000, "--g3-blocks", 6000, "--max-running", 32,
                         "--g3-path", tmp_path, "--chunk-bytes", 4096, "--no-progress")
    check_engine(r, 2000)
    assert r["config"]["g1_memory"] == "cuda"
