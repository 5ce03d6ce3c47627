#!/bin/sh
# Two "hosts" over real TCP: two network namespaces joined by a veth pair
# (10.231.X.1/.2 on a private /24 of this test's own namespaces), rank 0 in
# one, rank 1 started by Open MPI in the other through a plm_rsh_agent script
# (`ip netns exec`; its own UTS namespace, so another host name), MPI traffic
# and Open MPI's own channel only on that subnet (btl tcp, btl/oob_tcp_if_include).
# Weights after 20 steps equal one process x one device within 1e-5; bench
# allreduce runs across the link; a 4-trial clgrad sweep runs a trial on each
# of the two hosts' two devices. Skips (77) where namespaces cannot be made.
# usage: mpi_netns.sh PATH/TO/clgrad PYTHON MPI_BUILT(0|1)
clgrad="$1"; py="$2"; built="$3"
[ "$built" = 1 ] || { echo "skip: clgrad built without MPI" >&2; exit 77; }
command -v mpirun >/dev/null 2>&1 || { echo "skip: no mpirun on PATH (Debian: openmpi-bin)" >&2; exit 77; }
command -v ip >/dev/null 2>&1 || { echo "skip: no ip command (iproute2)" >&2; exit 77; }
command -v unshare >/dev/null 2>&1 || { echo "skip: no unshare (util-linux)" >&2; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
clgrad=$(cd "$(dirname "$clgrad")" && pwd)/$(basename "$clgrad")
tmp=$(mktemp -d /tmp/clgrad-netns-XXXXXX) || exit 1
id=$$; n0=clg$id-h0; n1=clg$id-h1; sub=$((id % 200 + 20))
net=10.231.$sub
cleanup() { ip netns del "$n0" 2>/dev/null; ip netns del "$n1" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
if ! ip netns add "$n0" 2>"$tmp/err"; then
    echo "skip: cannot create a network namespace ($(cat "$tmp/err"); needs root / CAP_SYS_ADMIN)" >&2; exit 77
fi
ip netns add "$n1" && ip link add "v$id-a" type veth peer name "v$id-b" &&
    ip link set "v$id-a" netns "$n0" && ip link set "v$id-b" netns "$n1" &&
    ip -n "$n0" addr add "$net.1/24" dev "v$id-a" && ip -n "$n1" addr add "$net.2/24" dev "v$id-b" &&
    ip -n "$n0" link set lo up && ip -n "$n1" link set lo up &&
    ip -n "$n0" link set "v$id-a" up && ip -n "$n1" link set "v$id-b" up ||
    { echo "skip: cannot build the veth link between the namespaces" >&2; exit 77; }
cat > "$tmp/agent.sh" <<AGENT
#!/bin/sh
# plm_rsh_agent: agent.sh HOST COMMAND... -> COMMAND inside HOST's namespace
host=\$1; shift
case "\$host" in
  $net.1) ns=$n0 ;;
  $net.2) ns=$n1 ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c 'hostname "\$0"; exec sh -c "\$*"' "\$ns" "\$@"
AGENT
chmod +x "$tmp/agent.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 POCL_DEVICES=basic
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# mpirun itself in host 0's namespace (and its own host name)
on2() {
    timeout 120 ip netns exec "$n0" unshare --uts sh -c 'hostname "$0"; shift; exec "$@"' "$n0" x \
        mpirun -np 2 --host "$net.1,$net.2" --mca plm_rsh_agent "$tmp/agent.sh" --mca btl tcp,self \
        --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" \
        -x POCL_DEVICES -x CLGRAD_CACHE_DIR -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "$@"
}
"$py" "$here/make_idx.py" "$tmp/data" 8 96 32 || { echo "cannot write the dataset"; exit 1; }
printf '[net]\nchannels = 1\nheight = 8\nwidth = 8\nclasses = 2\nbatch = 24\nlearning_rate = 0.02\nmomentum = 0.9\n[convolutional]\nname = c1\nfilters = 4\nsize = 3\npad = 1\n[activation]\nname = r1\ntype = relu\n[dense]\nname = fc1\nunits = 8\nactivation = relu\n[dense]\nname = fc2\nunits = 2\n[softmax]\n' > "$tmp/m.cfg"
T="--data $tmp/data --epochs 100 --steps 20 --no-eval --quiet"
# where each rank ran: its namespace's address
on2 sh -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(hostname): $(ip -br -4 addr | grep -o "10\.231\.[0-9.]*")"' >"$tmp/where" 2>&1
cat "$tmp/where"
grep -q "on $n1: $net.2" "$tmp/where" && grep -q "on $n0: $net.1" "$tmp/where" ||
    fail "the two ranks did not run in the two namespaces"
"$clgrad" train "$tmp/m.cfg" $T --save "$tmp/w1.st" >"$tmp/o" 2>&1 || { tail -5 "$tmp/o"; fail "1 process run"; }
if on2 "$clgrad" train "$tmp/m.cfg" $T --save "$tmp/w2.st" >"$tmp/o" 2>&1; then
    "$py" "$here/st_compare.py" "$tmp/w1.st" "$tmp/w2.st" 1e-5 || fail "2 hosts: weights differ from one process"
else
    tail -8 "$tmp/o"; fail "2-host training run failed"
fi
on2 "$clgrad" bench allreduce --max-mib 4 >"$tmp/o" 2>&1 || { tail -5 "$tmp/o"; fail "2-host bench allreduce"; }
grep -E "^ *4194304 |link" "$tmp/o"
# clgrad sweep over the two hosts (issue 25): rank 0 hands the 4 trials out, each
# rank runs them on its own host's two devices (one host's ranks share its devices)
POCL_DEVICES="basic basic" on2 "$clgrad" sweep "$tmp/m.cfg" --data "$tmp/data" --dir "$tmp/sw" --max-epochs 1 \
    --val-fraction 0.25 --param learning_rate=0.005,0.01,0.02,0.04 >"$tmp/o" 2>&1 || { tail -5 "$tmp/o"; fail "2-host sweep"; }
"$py" -c 'import csv, sys; d = sorted(r["devices"] for r in csv.DictReader(open(sys.argv[1])) if r["state"] == "ok")
sys.exit(0 if d == ["r0:0", "r0:1", "r1:0", "r1:1"] else print("  trials ran on", d) or 1)' "$tmp/sw/results.csv" ||
    fail "2-host sweep: the 4 trials did not run one on each device of the two hosts"
echo "mpi-netns: $fails failure(s)"
[ "$fails" -eq 0 ]
