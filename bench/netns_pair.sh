#!/bin/sh
# Two "hosts" for MPI benchmarks: network namespaces clgb-h0 / clgb-h1 joined
# by a veth pair (10.232.0.1 / 10.232.0.2), and /tmp/clgb-agent.sh, an
# Open MPI plm_rsh_agent that starts a command inside a host's namespace.
# The two "hosts" share this machine's cores: each would bind its rank to
# core 0 of its own "node" (--bind-to core), so the prefix binds nothing.
#   sh bench/netns_pair.sh up     # prints the mpirun prefix to use
#   sh bench/netns_pair.sh down
# (tests/train/mpi_netns.sh builds the same with names of its own.)
set -e
case "$1" in
up)
    ip netns add clgb-h0; ip netns add clgb-h1
    ip link add clgb-a type veth peer name clgb-b
    ip link set clgb-a netns clgb-h0; ip link set clgb-b netns clgb-h1
    ip -n clgb-h0 addr add 10.232.0.1/24 dev clgb-a; ip -n clgb-h1 addr add 10.232.0.2/24 dev clgb-b
    for n in clgb-h0 clgb-h1; do ip -n $n link set lo up; done
    ip -n clgb-h0 link set clgb-a up; ip -n clgb-h1 link set clgb-b up
    cat > /tmp/clgb-agent.sh <<'AGENT'
#!/bin/sh
host=$1; shift
case "$host" in 10.232.0.1) ns=clgb-h0 ;; 10.232.0.2) ns=clgb-h1 ;; *) echo "unknown host $host" >&2; exit 1 ;; esac
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0"; exec sh -c "$*"' "$ns" "$@"
AGENT
    chmod +x /tmp/clgb-agent.sh
    echo "ip netns exec clgb-h0 unshare --uts sh -c 'hostname clgb-h0; exec \"\$0\" \"\$@\"' mpirun -np 2 --bind-to none --host 10.232.0.1,10.232.0.2 --mca plm_rsh_agent /tmp/clgb-agent.sh --mca btl tcp,self --mca btl_tcp_if_include 10.232.0.0/24 --mca oob_tcp_if_include 10.232.0.0/24"
    ;;
down)
    ip netns del clgb-h0 2>/dev/null || true; ip netns del clgb-h1 2>/dev/null || true; rm -f /tmp/clgb-agent.sh ;;
*) echo "usage: netns_pair.sh up|down" >&2; exit 2 ;;
esac
