#!/usr/bin/env python3
"""Data-parallel scaling on PoCL CPU devices, both sides in the same run.

PoCL's `basic` device runs kernels in the host thread that waits on its
queue, so POCL_DEVICES="basic basic" with clgrad's host thread per device
gives two devices that really compute side by side (one core each here);
POCL_DEVICES=basic is the one-device baseline. Rounds alternate the sides;
medians are reported.

  /usr/bin/python3 bench/dp_scaling.py --clgrad build/tools/clgrad [--repeat 3] [--steps 20]

First run after a one-device cache fill (issue 24 item 3): --first-runs K
runs K sequences, each on an empty cache directory of its own: one
`basic` run (fills the cache for the one-device shapes), then `basic
basic` (the per-device batch sizes meet their kernels and algorithm
timing for the first time) and `basic` again; the ratio is the 2-device
run against the mean of the two 1-device runs.

  /usr/bin/python3 bench/dp_scaling.py --first-runs 3 --models models/lenet5.cfg

Fresh pairs (issue 24 target: 2 `basic` devices vs 1 in each of 5
consecutive runs, the first included, as a new user runs it): --fresh-pairs
N runs N pairs, each run (2 devices and 1) on an empty cache directory of
its own, the order alternating (2 then 1, 1 then 2, ...), the 1-device run
warmed up for as many steps as the 2-device run ran (the pair's own, or the
previous pair's when the 1-device run goes first); it prints every
pair's ratio, the lowest, the load average beside each run (a loaded
machine ruins the ratio, not the traced busy fractions), and with --trace
each 2-device run's per-lane busy fraction (compute over the step span),
idle wait for the other lane and reduction milliseconds per step
(trace_summary.py). MODEL:STEPS in --models sets a model's timed steps.
After the pairs, each side's throughput in each pair against that side's
median (which side a low pair owes its ratio to) and the convolution
algorithms a run chose otherwise than most runs of its side (each run
measures its own on its empty cache), and each side's median CPU ms per
step with the bound 2 x (1-device / 2-device) it puts on the speed-up
(CPU time: what a step costs, which a loaded machine disturbs far less
than the throughput). --set KEY=VALUE passes an option to
both sides (e.g. --set dp_caller_lane=0: lane 0 on a thread of its own).
--ref CLGRAD runs every pair on that build too (an A/B: the builds' order
alternates from pair to pair; each build's ratios and sides are reported).

  /usr/bin/python3 bench/dp_scaling.py --fresh-pairs 5 --models models/vgg-s.cfg:20,models/lenet5.cfg:300 --trace

Where the 2-device step's extra CPU comes from: --contention K runs K
alternating rounds (warm cache) of the 2-device run at batch B, two
independent 1-device processes at batch B/2 side by side (no reduction, no
hand-off: data parallelism without any of clgrad's data-parallel code), and
one 1-device process at B and at B/2 alone. CPU ms per step (medians): 2
devices minus the two processes is what the data-parallel code adds (the
reduction, the second optimizer, hand-offs, launches on two devices); the
two processes minus twice the half batch alone is what two busy cores cost
the same work (shared cache and memory, clock); twice the half batch alone
against the whole batch is the per-sample cost of the half batch. The two
processes' summed throughput against the 1-device run bounds what any
2-device split of the same work reaches on the machine.

  /usr/bin/python3 bench/dp_scaling.py --contention 5 --models models/lenet5.cfg:300

Heterogeneous pair: lane 1 posing as a device half as fast
(--set test_slow_lane=1:1.0, a test aid: the lane waits as long again as
it computed). Ideal = lane 0's own throughput + the slowed lane's own
throughput (each measured alone); the speed-weighted split (auto) is
compared with it and with an even split. `basic pthread` (a pthread device
with its default workers beside a basic one: unequal devices competing for
the two cores) is reported beside it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def bench(clgrad, model, batch, steps, devices, options, split=None, warmup=5, trace=None):
    env = dict(os.environ)
    env["POCL_DEVICES"] = devices
    cmd = [clgrad, "bench", "train", "--model", model, "--batch", str(batch), "--steps", str(steps),
           "--warmup", str(warmup), "--json"]
    if trace:
        cmd += ["--trace", trace]
    for kv in options.items():
        cmd += ["--set", "%s=%s" % kv]
    if split:
        cmd += ["--split", split]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), out.stderr[-2000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def first_runs(a):
    """The first 2-device run after a 1-device cache fill, on fresh caches."""
    for model in a.models.split(","):
        ratios = []
        for k in range(a.first_runs):
            with tempfile.TemporaryDirectory(prefix="clgrad-first-") as cache:
                os.environ["CLGRAD_CACHE_DIR"] = cache
                one = bench(a.clgrad, model, a.batch, a.steps, "basic", {}, warmup=a.warmup)
                two = bench(a.clgrad, model, a.batch, a.steps, "basic basic", {}, warmup=a.warmup)
                again = bench(a.clgrad, model, a.batch, a.steps, "basic", {}, warmup=a.warmup)
            base = (one["images_per_s"] + again["images_per_s"]) / 2
            r = two["images_per_s"] / base
            ratios.append(r)
            print("%s sequence %d: 1 basic %.1f / %.1f img/s, 2 basic (first) %.1f img/s (shares %s, first step "
                  "%.1f s): %.2fx" % (model, k + 1, one["images_per_s"], again["images_per_s"], two["images_per_s"],
                                      two.get("shares", ""), two.get("first_step_s", 0), r))
        print("%s: first 2-device run on a fresh cache, %d sequences: %s (lowest %.2fx)" % (
            model, len(ratios), ", ".join("%.2fx" % r for r in ratios), min(ratios)))


def lane_figures(trace):
    """'lane 0 busy 93% wait 4.1 ms, 0.12 ms between steps, ...; reduction 2.1 ms' from a 2-device run's trace."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import trace_summary
    lanes = trace_summary.summarize(trace)
    parts = ["lane %d busy %.0f%% wait %.1f ms, %.2f ms between steps, last %.0f%%" % (
        i, 100 * r["busy"], r.get("host: wait for other lanes", 0), r.get("between steps", 0), 100 * r["last"])
             for i, r in enumerate(lanes.values())]
    red = max(r["reduction"] for r in lanes.values())
    span = max(r["span"] for r in lanes.values())
    return "%s; reduction %.1f ms of a %.1f ms step" % (", ".join(parts), red, span)


def algo_choices(cache):
    """{shape key: algorithm} the run measured into its cache's conv-algos files."""
    out = {}
    for f in sorted(os.listdir(cache)):
        if f.startswith("conv-algos-") and f.endswith(".json"):
            try:
                for e in json.load(open(os.path.join(cache, f))).get("entries", []):
                    out[e["key"]] = e["algo"]
            except (OSError, ValueError, KeyError):
                pass
    return out


def off_side(model, pairs):
    """Per pair: each side's throughput against that side's median over the pairs (which side was off),
    and the convolution algorithms where a run chose otherwise than most runs of its side."""
    for dev, name in (("basic basic", "2-device"), ("basic", "1-device")):
        med = statistics.median(p[dev]["images_per_s"] for p in pairs)
        common = {}
        for key in set().union(*(p[dev]["algos"] for p in pairs)):
            votes = [p[dev]["algos"][key] for p in pairs if key in p[dev]["algos"]]
            common[key] = max(set(votes), key=votes.count)
        for k, p in enumerate(pairs):
            j = p[dev]
            odd = ["%s: %s (most runs: %s)" % (key, algo, common[key]) for key, algo in sorted(j["algos"].items())
                   if algo != common[key]]
            print("%s pair %d %s side: %.2fx its median (%.1f img/s, CPU ms per step %.1f)%s" % (
                model, k + 1, name, j["images_per_s"] / med, j["images_per_s"], j.get("cpu_ms_per_step", 0),
                "".join("\n    other choice " + o for o in odd)), flush=True)


def fresh_pair(a, clgrad, model, steps, k, warm2):
    """One pair of fresh-cache runs of clgrad (2 basic devices and 1, order by k); returns {devices: report}."""
    order = ["basic basic", "basic"] if k % 2 == 0 else ["basic", "basic basic"]
    res = {}
    with tempfile.TemporaryDirectory(prefix="clgrad-fresh-") as tmp:
        for dev in order:
            cache = os.path.join(tmp, "cache-%d" % len(dev))
            os.mkdir(cache)
            os.environ["CLGRAD_CACHE_DIR"] = cache
            trace = os.path.join(tmp, "trace.json") if a.trace and dev == "basic basic" else None
            load = os.getloadavg()[0]
            # the same warm-up on both sides: the 1-device run warms up for as many steps as the
            # 2-device run did (it runs on until its split settled), so neither side's timed steps
            # start earlier after its algorithm timing and first touches
            warm = a.warmup if dev == "basic basic" else max(a.warmup, warm2)
            j = bench(clgrad, model, a.batch, steps, dev, a.options, warmup=warm, trace=trace)
            j["algos"] = algo_choices(cache)
            if dev == "basic basic":
                warm2 = j.get("warmup_run", a.warmup)
            j["load"] = (load, os.getloadavg()[0])
            j["lanes"] = lane_figures(trace) if trace else ""
            res[dev] = j
    res["warm2"] = warm2
    return res


def fresh_pairs(a):
    """N pairs of fresh-cache runs, 2 basic devices against 1, the order alternating; with --ref, each pair
    also on the reference build, the builds' order alternating too."""
    builds = [("", a.clgrad)] + ([("ref ", a.ref)] if a.ref else [])
    for spec in a.models.split(","):
        model, _, st = spec.partition(":")
        steps = int(st) if st else a.steps
        ratios = {tag: [] for tag, _ in builds}
        pairs = {tag: [] for tag, _ in builds}
        warm2 = {tag: a.warmup for tag, _ in builds}  # the warm-up the build's last 2-device run ran
        for k in range(a.fresh_pairs):
            for tag, clgrad in (builds if k % 2 == 0 else builds[::-1]):
                res = fresh_pair(a, clgrad, model, steps, k, warm2[tag])
                warm2[tag] = res.pop("warm2")
                pairs[tag].append(res)
                two, one = res["basic basic"], res["basic"]
                r = two["images_per_s"] / one["images_per_s"]
                ratios[tag].append(r)
                print("%s%s pair %d (%s first): 2 basic %.1f img/s (shares %s, warm-up %s, timed split moves %s) / "
                      "1 basic %.1f img/s (warm-up %s) = %.2fx; CPU ms per step %.1f / %.1f; load %.1f-%.1f / "
                      "%.1f-%.1f%s" % (
                          tag, model, k + 1, "2" if k % 2 == 0 else "1", two["images_per_s"], two.get("shares", ""),
                          two.get("warmup_run", "?"), two.get("split_moves_timed", "?"), one["images_per_s"],
                          one.get("warmup_run", "?"), r, two.get("cpu_ms_per_step", 0), one.get("cpu_ms_per_step", 0),
                          two["load"][0], two["load"][1], one["load"][0], one["load"][1],
                          "\n    " + two["lanes"] if two["lanes"] else ""), flush=True)
        for tag, clgrad in builds:
            rs = ratios[tag]
            print("%s%s (%s): %d fresh-cache pairs, 2 basic vs 1: %s; lowest %.2fx, median %.2fx (load average %.1f "
                  "now, %d CPUs)" % (tag, model, clgrad, len(rs), ", ".join("%.2fx" % r for r in rs), min(rs),
                                     statistics.median(rs), os.getloadavg()[0], os.cpu_count()), flush=True)
            # CPU time per step, which other processes' load disturbs far less than the throughput: the work a
            # step costs on each side; 2 x (1-device CPU / 2-device CPU) bounds the speed-up the lanes can reach
            c2 = statistics.median(p["basic basic"].get("cpu_ms_per_step", 0) for p in pairs[tag])
            c1 = statistics.median(p["basic"].get("cpu_ms_per_step", 0) for p in pairs[tag])
            if c2 > 0:
                print("%s%s: CPU ms per step (medians) 2 basic %.2f / 1 basic %.2f: work bound %.2fx" % (
                    tag, model, c2, c1, 2 * c1 / c2), flush=True)
            off_side(tag + model, pairs[tag])


def contention(a):
    """2 devices at batch B against two independent 1-device processes at B/2 side by side, and 1 device at B
    and B/2 alone (warm cache): which part of the 2-device step's extra CPU is clgrad's data-parallel code and
    which part the machine's (two busy cores)."""
    for spec in a.models.split(","):
        model, _, st = spec.partition(":")
        steps = int(st) if st else a.steps
        half = max(1, a.batch // 2)
        for b in (a.batch, half):  # warm the cache for both batch sizes, one process at a time
            bench(a.clgrad, model, b, 2, "basic", a.options, warmup=2)
        bench(a.clgrad, model, a.batch, 2, "basic basic", a.options, warmup=2)
        names = ["2 devices, batch %d" % a.batch, "2 processes, batch %d each" % half, "1 device, batch %d" % a.batch,
                 "1 device, batch %d" % half]
        runs = {n: [] for n in names}
        for r in range(a.contention):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                load = os.getloadavg()[0]
                if name == names[1]:
                    js = side_by_side(a, model, half, steps)
                    j = {"cpu_ms_per_step": sum(x["cpu_ms_per_step"] for x in js),
                         "images_per_s": sum(x["images_per_s"] for x in js)}
                else:
                    dev = "basic basic" if name == names[0] else "basic"
                    j = bench(a.clgrad, model, a.batch if name != names[3] else half, steps, dev, a.options,
                              warmup=a.warmup)
                j["load"] = load
                runs[name].append(j)
                print("%s round %d %-28s CPU ms per step %6.2f  %8.1f img/s  load %.1f" % (
                    model, r + 1, name, j["cpu_ms_per_step"], j["images_per_s"], load), file=sys.stderr, flush=True)
        cpu = {n: statistics.median(j["cpu_ms_per_step"] for j in runs[n]) for n in names}
        ips = {n: statistics.median(j["images_per_s"] for j in runs[n]) for n in names}
        two, procs, one, halfc = (cpu[n] for n in names)
        print("\n%s, %d timed steps, medians of %d alternating rounds (load %.1f now, %d CPUs)" % (
            model, steps, a.contention, os.getloadavg()[0], os.cpu_count()))
        print("| run | CPU ms per step | images/s |")
        print("|---|---:|---:|")
        for n in names:
            print("| %s | %.2f | %.0f |" % (n, cpu[n], ips[n]))
        print("2 devices over 1: CPU %+.1f%%, of which the data-parallel code %+.1f%% (2 devices - 2 processes), two "
              "busy cores %+.1f%% (2 processes - 2 x batch %d alone), the half batch %+.1f%% (2 x batch %d alone - "
              "batch %d); work bound 2 x 1-device / 2-device CPU %.2fx; two independent processes %.2fx the "
              "1-device throughput, 2 devices %.2fx" % (
                  100 * (two / one - 1), 100 * (two - procs) / one, 100 * (procs - 2 * halfc) / one, half,
                  100 * (2 * halfc - one) / one, half, a.batch, 2 * one / two, ips[names[1]] / ips[names[2]],
                  ips[names[0]] / ips[names[2]]))


def side_by_side(a, model, batch, steps):
    """Two 1-device runs started together (one core each when the machine is idle); their reports."""
    env = dict(os.environ)
    env["POCL_DEVICES"] = "basic"
    cmd = [a.clgrad, "bench", "train", "--model", model, "--batch", str(batch), "--steps", str(steps), "--warmup",
           str(a.warmup), "--json"]
    for kv in a.options.items():
        cmd += ["--set", "%s=%s" % kv]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    out = []
    for p in procs:
        o, e = p.communicate()
        if p.returncode != 0:
            sys.exit("failed: %s\n%s" % (" ".join(cmd), e[-2000:]))
        out.append(json.loads(o.strip().splitlines()[-1]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clgrad", default="build/tools/clgrad")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--models", default="models/vgg-s.cfg,models/lenet5.cfg")
    ap.add_argument("--skip-hetero", action="store_true")
    ap.add_argument("--first-runs", type=int, default=0,
                    help="instead: K fresh-cache sequences 1 basic, 2 basic, 1 basic (the first 2-device run)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="warm-up steps (default 5; --fresh-pairs: 3, bench train's own default)")
    ap.add_argument("--fresh-pairs", type=int, default=0,
                    help="instead: N pairs (2 basic vs 1), every run on an empty cache, order alternating")
    ap.add_argument("--ref", default=None, metavar="CLGRAD",
                    help="--fresh-pairs: also every pair on this build, alternating with --clgrad")
    ap.add_argument("--contention", type=int, default=0, metavar="K",
                    help="instead: K rounds of 2 devices vs two 1-device processes at half the batch vs 1 device")
    ap.add_argument("--trace", action="store_true", help="--fresh-pairs: per-lane busy/wait/reduction figures")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="--fresh-pairs, --contention: an option for every run (e.g. dp_caller_lane=0 for an A/B)")
    a = ap.parse_args()
    a.options = dict(kv.split("=", 1) for kv in a.set)
    if a.fresh_pairs > 0:
        a.warmup = 3 if a.warmup is None else a.warmup
        fresh_pairs(a)
        return
    a.warmup = 5 if a.warmup is None else a.warmup
    if a.contention > 0:
        contention(a)
        return
    if a.first_runs > 0:
        first_runs(a)
        return
    slow = {"test_slow_lane": "1:1.0"}
    for model in a.models.split(","):
        # warm the program and conv-algorithm caches for both batch sizes a device sees, one device
        # at a time, so algorithm timing is not done while another device competes for the cores
        for b in (a.batch, a.batch // 2):
            bench(a.clgrad, model, b, 2, "basic", {})
        bench(a.clgrad, model, a.batch, 2, "basic basic", {}, "even")
        runs = {}
        cases = [("1 basic", "basic", {}, None), ("2 basic", "basic basic", {}, None)]
        if not a.skip_hetero:
            cases += [
                ("lane 0 alone", "basic", {}, None),
                ("slowed lane alone", "basic", {"test_slow_lane": "0:1.0"}, None),
                ("2 basic, lane 1 slowed, split auto", "basic basic", slow, None),
                ("2 basic, lane 1 slowed, split even", "basic basic", slow, "even"),
                ("basic + pthread, split auto", "basic pthread", {}, None),
                ("basic + pthread, split even", "basic pthread", {}, "even"),
            ]
        for r in range(a.repeat):
            order = cases if r % 2 == 0 else list(reversed(cases))
            for name, dev, env, split in order:
                j = bench(a.clgrad, model, a.batch, a.steps, dev, env, split)
                runs.setdefault(name, []).append(j)
                print("%s round %d %-38s %8.1f img/s  shares %s" % (model, r + 1, name, j["images_per_s"],
                                                                   j.get("shares", "")), file=sys.stderr)
        med = {k: statistics.median(x["images_per_s"] for x in v) for k, v in runs.items()}
        print("\n%s, batch %d, %d timed steps, medians of %d alternating rounds" % (model, a.batch, a.steps,
                                                                                   a.repeat))
        print("| configuration | images/s | vs 1 basic | shares (last round) |")
        print("|---|---:|---:|---|")
        for k in runs:
            print("| %s | %.0f | %.2fx | %s |" % (k, med[k], med[k] / med["1 basic"], runs[k][-1].get("shares", "")))
        if not a.skip_hetero:
            ideal = med["lane 0 alone"] + med["slowed lane alone"]
            auto = med["2 basic, lane 1 slowed, split auto"]
            even = med["2 basic, lane 1 slowed, split even"]
            print("heterogeneous: ideal (sum of the lanes alone) %.0f img/s; speed-weighted split %.0f = %.2fx ideal, "
                  "%.2fx the even split (%.0f)" % (ideal, auto, auto / ideal, auto / even, even))


if __name__ == "__main__":
    main()
