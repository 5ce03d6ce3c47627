#!/usr/bin/env python3
"""MPI data-parallel scaling: measurements here, and a model of step time and
scaling efficiency for N ranks checked against them.

Model (one step, global batch B, N ranks; buckets of the flat gradient of
S bytes in reverse layer order):
  t(N)   = t_c(B/N) + t_host + t_exposed
  t_ar   = ring all-reduce of a bucket of s bytes: 2(N-1)/N * s / bw + 2(N-1) * alpha
  t_exposed = all-reduce time not hidden behind backward: the last bucket's
           t_ar always; earlier buckets overlap the rest of backward
           (max(0, sum of their t_ar - backward time after they are ready));
  t_host = bucket read + host sum + write-back (the device <-> host copies
           of the hierarchical reduction; measured per model in the trace).
t_c(b) is measured: one rank at the per-rank batch b (strong scaling: the
global batch fixed) or the per-GPU compute time assumed for a GPU (weak
scaling: per-GPU batch fixed, global batch N * b). Efficiency = t_c / t(N)
(weak) or t(1) / (N t(N)) (strong).

  /usr/bin/python3 bench/mpi_scaling.py --measure --clgrad build/tools/clgrad [--repeat 3]
        [--netns "$(sh bench/netns_pair.sh up)"]
  /usr/bin/python3 bench/mpi_scaling.py --predict --grad-mb 3.5 --gpu-step-ms 10

Measurements (POCL_DEVICES=basic: one device computing in one host thread,
one core per rank with --bind-to core): bench train at batch B and B/2 on
one rank, 2 ranks x 1 device at batch B (over the loopback, and over the
namespace veth link with --netns), bench allreduce at the gradient's size and
at 64 MiB, the link's ping-pong bandwidth. Sides alternate in every round;
medians are reported.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "POCL_DEVICES": "basic"}
MPI = ["mpirun", "--bind-to", "core", "--mca", "btl", "tcp,self", "-x", "POCL_DEVICES", "-x", "CLGRAD_CACHE_DIR"]


def run(cmd, what):
    env = dict(os.environ)
    env.update(ENV)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, shell=isinstance(cmd, str))
    if out.returncode != 0:
        sys.exit("failed (%s): %s\n%s" % (what, cmd, out.stderr[-2000:]))
    return out.stdout


def bench_train(clgrad, model, batch, steps, prefix=None, extra=()):
    cmd = [clgrad, "bench", "train", "--model", model, "--batch", str(batch), "--steps", str(steps),
           "--warmup", "5", "--json"] + list(extra)
    if prefix is None:
        out = run(cmd, "bench train")
    elif isinstance(prefix, str):  # a shell prefix (namespaces)
        out = run(prefix + " -x POCL_DEVICES -x CLGRAD_CACHE_DIR -x OMPI_ALLOW_RUN_AS_ROOT -x "
                  "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM " + " ".join(cmd), "bench train (netns)")
    else:
        out = run(prefix + cmd, "bench train (mpirun)")
    return json.loads(out.strip().splitlines()[-1])


def bench_allreduce(clgrad, max_mib, prefix):
    cmd = [clgrad, "bench", "allreduce", "--max-mib", str(max_mib), "--json"]
    out = run(prefix + " " + " ".join(cmd) if isinstance(prefix, str) else prefix + cmd, "bench allreduce")
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return {r["bytes"]: r for r in rows if "bytes" in r}, [r for r in rows if "link_gbs" in r][0]["link_gbs"]


def grad_buckets(clgrad, model, batch):
    """Bucket sizes (MiB) and the host part of the reduction (ms per step), from a 2-rank --trace."""
    with tempfile.TemporaryDirectory() as d:
        tr = os.path.join(d, "t.json")
        run(MPI + ["-np", "2", clgrad, "bench", "train", "--model", model, "--batch", str(batch), "--steps", "4",
                   "--warmup", "2", "--trace", tr], "trace")
        ev = json.load(open(tr))["traceEvents"]
    sizes = {}
    host = 0.0
    for e in ev:
        if e.get("ph") != "X":
            continue
        m = re.match(r"all-reduce bucket (\d+) \(([\d.]+) MiB\)", e["name"])
        if m:
            sizes[int(m.group(1))] = float(m.group(2))
        if e["pid"] == 0 and re.match(r"(grad read|grad write|sum) bucket", e["name"]):
            host += e["dur"] / 1000.0
    return [sizes[k] for k in sorted(sizes)], host / 4


def tcp_loopback_gbs(mib=256):
    """The loopback link itself: one TCP stream over 127.0.0.1 (Python sockets, 4 MiB writes)."""
    import socket
    import threading
    import time
    n = mib << 20
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def rx():
        c, _ = srv.accept()
        got, m = 0, memoryview(bytearray(4 << 20))
        while got < n:
            got += c.recv_into(m)
        c.sendall(b"x")
        c.close()

    t = threading.Thread(target=rx)
    t.start()
    s = socket.create_connection(srv.getsockname())
    buf = bytearray(4 << 20)
    t0 = time.time()
    for _ in range(n // len(buf)):
        s.sendall(buf)
    s.recv(1)
    dt = time.time() - t0
    t.join()
    s.close()
    srv.close()
    return n / dt / 1e9


def t_ar(n, mib, bw_gbs, alpha_s):
    if n < 2:
        return 0.0
    return 2 * (n - 1) / n * mib * 1048576 / (bw_gbs * 1e9) + 2 * (n - 1) * alpha_s


def model_step(n, t_c, buckets_mib, bw_gbs, alpha_s, t_host, bwd_frac=0.75):
    """Predicted step seconds: compute + host copies + exposed all-reduce."""
    if n < 2:
        return t_c
    total = sum(buckets_mib)
    ar = [t_ar(n, b, bw_gbs, alpha_s) for b in buckets_mib]
    # bucket i is ready after backward has produced buckets 0..i; the rest of
    # backward (the share of the gradient still to come) hides earlier all-reduces
    bwd = bwd_frac * t_c
    exposed = ar[-1]
    done = 0.0
    for i, b in enumerate(buckets_mib[:-1]):
        done += b
        exposed += max(0.0, ar[i] - bwd * (1 - done / total))
    return t_c + t_host + exposed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clgrad", default="build/tools/clgrad")
    ap.add_argument("--model", default="models/vgg-s.cfg")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--netns", default=None, help="mpirun prefix for two namespaced hosts (bench/netns_pair.sh up)")
    ap.add_argument("--predict", action="store_true")
    ap.add_argument("--grad-mb", type=float, default=None, help="gradient MiB (default: measured)")
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--alpha-us", type=float, default=30.0, help="per-message latency for the prediction")
    ap.add_argument("--gpu-step-ms", default="10,40", help="assumed per-GPU compute ms per step (weak scaling)")
    a = ap.parse_args()
    res = {}
    if a.measure:
        B = a.batch
        one, half, two, ns = [], [], [], []
        for r in range(a.repeat):
            sides = ["one", "half", "two"] + (["ns"] if a.netns else [])
            if r % 2:
                sides.reverse()
            for s in sides:
                if s == "one":
                    one.append(bench_train(a.clgrad, a.model, B, a.steps, MPI + ["-np", "1"]))
                elif s == "half":
                    half.append(bench_train(a.clgrad, a.model, B // 2, a.steps, MPI + ["-np", "1"]))
                elif s == "two":
                    two.append(bench_train(a.clgrad, a.model, B, a.steps, MPI + ["-np", "2"]))
                else:
                    ns.append(bench_train(a.clgrad, a.model, B, a.steps, a.netns))
            print("round %d: 1 rank %.0f img/s, 1 rank b%d %.0f, 2 ranks %.0f%s" % (
                r + 1, one[-1]["images_per_s"], B // 2, half[-1]["images_per_s"], two[-1]["images_per_s"],
                (", 2 ranks netns %.0f" % ns[-1]["images_per_s"]) if ns else ""), flush=True)
        med = lambda xs, k: statistics.median(x[k] for x in xs)
        res = {"one_ips": med(one, "images_per_s"), "two_ips": med(two, "images_per_s"),
               "one_ms": med(one, "ms_per_step_median"), "half_ms": med(half, "ms_per_step_median"),
               "two_ms": med(two, "ms_per_step_median")}
        if ns:
            res["ns_ips"] = med(ns, "images_per_s")
            res["ns_ms"] = med(ns, "ms_per_step_median")
        buckets, host_ms = grad_buckets(a.clgrad, a.model, B)
        res["buckets_mib"], res["host_ms"] = buckets, host_ms
        ar, link = bench_allreduce(a.clgrad, 64, MPI + ["-np", "2"])
        res["link_gbs"] = link
        res["tcp_loopback_gbs"] = statistics.median(tcp_loopback_gbs() for _ in range(3))
        res["ar64_busbw"] = ar[64 << 20]["busbw_gbs"]
        if a.netns:
            arn, linkn = bench_allreduce(a.clgrad, 64, a.netns)
            res["ns_link_gbs"], res["ns_ar64_busbw"] = linkn, arn[64 << 20]["busbw_gbs"]
        # effective bandwidth at the gradient's size (nearest measured size)
        S = sum(buckets) * 1048576
        near = min(ar, key=lambda b: abs(b - S))
        res["bw_at_grad"] = ar[near]["busbw_gbs"]
        print(json.dumps(res))
        print("\n| | 1 rank | 2 ranks loopback | speed-up |%s" % (" 2 ranks netns | speed-up |" if ns else ""))
        print("|---|---:|---:|---:|%s" % ("---:|---:|" if ns else ""))
        print("| images/s | %.0f | %.0f | %.2fx |%s" % (res["one_ips"], res["two_ips"], res["two_ips"] / res["one_ips"],
              (" %.0f | %.2fx |" % (res["ns_ips"], res["ns_ips"] / res["one_ips"])) if ns else ""))
        # model check: t(2) from t_c(B/2) + host + exposed all-reduce at the measured bandwidth
        pred = model_step(2, res["half_ms"] / 1e3, buckets, res["bw_at_grad"], 0, res["host_ms"] / 1e3) * 1e3
        print("\nmodel check (2 ranks, loopback): t_c(%d) = %.1f ms (1 rank, measured), host copies %.1f ms, "
              "gradient %.2f MiB in %d bucket(s), all-reduce bus bandwidth at that size %.3f GB/s -> "
              "predicted %.1f ms/step, measured %.1f ms/step (1 rank at %d: %.1f ms)" % (
                  B // 2, res["half_ms"], res["host_ms"], sum(buckets), len(buckets), res["bw_at_grad"], pred,
                  res["two_ms"], B, res["one_ms"]))
        print("bench allreduce 64 MiB: bus bandwidth %.3f GB/s, MPI ping-pong %.3f GB/s (%.2fx), TCP loopback "
              "stream %.3f GB/s (%.2fx)" % (res["ar64_busbw"], link, link / res["ar64_busbw"],
                                            res["tcp_loopback_gbs"], res["tcp_loopback_gbs"] / res["ar64_busbw"]))
        if a.netns:
            print("netns link: all-reduce 64 MiB %.3f GB/s, ping-pong %.3f GB/s (%.2fx)" % (
                res["ns_ar64_busbw"], res["ns_link_gbs"], res["ns_link_gbs"] / res["ns_ar64_busbw"]))
    if a.predict or a.measure:
        grad = a.grad_mb if a.grad_mb else sum(res.get("buckets_mib", [3.5]))
        nb = max(1, int(-(-grad // a.bucket_mb)))
        buckets = [grad / nb] * nb
        print("\nprediction, weak scaling (per-GPU batch fixed), gradient %.2f MiB in %d bucket(s), ring "
              "all-reduce, %.0f us per message, host copies over PCIe ~12 GB/s:" % (grad, nb, a.alpha_us))
        host = 2 * grad * 1048576 / 12e9
        print("\n| GPU compute ms/step | link | " + " | ".join("%d GPUs" % n for n in (8, 16, 32, 64)) + " |")
        print("|---:|---|" + "---:|" * 4)
        for g in [float(x) for x in a.gpu_step_ms.split(",")]:
            for gbit in (25, 100):
                bw = gbit / 8.0  # GB/s
                cells = []
                for n in (8, 16, 32, 64):
                    t = model_step(n, g / 1e3, buckets, bw, a.alpha_us * 1e-6, host)
                    cells.append("%.1f ms, %.0f%%" % (t * 1e3, 100 * g / 1e3 / t))
                print("| %.0f | %d Gb/s | %s |" % (g, gbit, " | ".join(cells)))
        print("\n(cells: predicted step time, scaling efficiency = compute / step)")


if __name__ == "__main__":
    main()
