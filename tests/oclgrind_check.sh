#!/bin/sh
# Runs a test program under oclgrind and fails on any report it makes
# (data races, uninitialized values, out-of-bounds, API misuse, and
# oclgrind's own "FATAL ERROR" on an instruction it cannot interpret), and
# when the program exits non-zero (a crash of the simulator included).
# Exit 77 (skip) when oclgrind is missing or the program skips.
# usage: oclgrind_check.sh PROGRAM [ARGS...]
# OCLGRIND_CHECK_LOG=FILE keeps the full oclgrind log there.
# Device limits come from the environment, which oclgrind's runtime reads:
# OCLGRIND_LOCAL_MEM_SIZE (bytes), OCLGRIND_MAX_WGSIZE (work-items per group
# and per dimension), OCLGRIND_COMPUTE_UNITS; unset, oclgrind's defaults
# (32 KiB, 1024). The GPU profiles of tests/portability set them. A launch
# beyond them is an API error (--check-api) and fails the test like any report.
# CLGRAD_OCLGRIND_SHIM=FILE (tests/oclgrind_fill_shim.c, set by Meson) is
# preloaded ahead of oclgrind's runtime: see the clEnqueueFillBuffer defect below.
#
# Two oclgrind 21.10 defects of --uninitialized that look like kernel bugs:
# - Every host write into a buffer (clEnqueueWriteBuffer, and
#   clEnqueueFillBuffer, which writes pattern by pattern) re-creates that
#   buffer's shadow memory with the size of that one write. Kernel stores
#   past it are not recorded, so after a partial host write (fewer bytes
#   than CL_MEM_SIZE, e.g. n floats into a pool block of a larger size
#   class) a kernel that writes the whole buffer and a kernel that then
#   reads it get "Uninitialized value" reports for the part beyond the host
#   write; with the device pool the buffer can come back later as another
#   operation's workspace. Host writes in tests must cover the whole buffer
#   (tests/conv/test_conv.c: write_full). Minimal reproducer: a 256-byte
#   buffer, clEnqueueWriteBuffer of its first 100 bytes, a kernel writing
#   all 64 floats, a kernel copying them: 39 reports (floats 25..63); with a
#   full 256-byte write, or none, 0 reports.
# - clEnqueueFillBuffer is applied pattern by pattern, each a host write of
#   pattern_size bytes that re-creates the shadow memory (above), so after a
#   fill only the last pattern counts as initialised: a bias filled with 0
#   read by direct_fwd gave 1,000 "Controlflow depends on uninitialized
#   value" reports at `acc = fmax(acc, 0.0f)` (cl/conv.cl), and the SGD
#   momentum zeroed by src/train/optim.c gives "Uninitialized value written"
#   in sgd_step. The values are initialised (PoCL computes with them
#   correctly). The library fills by kernel (clg_buf_fill); the shim turns
#   the remaining API fills into one write of the whole range.
#   The host write's size also outlives the buffer: after a host write of
#   320 bytes (the whole of a 320-byte buffer) and clReleaseMemObject, the
#   next buffer created (256 floats, filled by a kernel) is tracked for its
#   first 320 bytes only (176 reports from a kernel reading it). The
#   parameter arena (src/model/arena.c) therefore keeps the parameter
#   buffers it replaces in the pool (reused only at their own size), each
#   zeroed by one host write of its whole block first.
# - clEnqueueCopyBuffer to a nonzero destination offset leaves the copied
#   range's shadow memory uninitialised (the values are right): 176 reports
#   for a kernel reading 256 floats copied to offset 64 of a kernel-written
#   buffer, 0 with offset 0. It showed as reports in the fp16 backward of
#   resnet-mini (the [add] layer copies its output gradient to each input's
#   gradient buffer). clg_nn_copy uses a copy kernel.
# - A shufflevector whose mask has undef lanes crashes it (segfault):
#   LLVM emits one for a sum of lanes of one vector, e.g. v.s0 + v.s7 or
#   (h.x + h.y) + (h.z + h.w). Sum lanes with dot() instead (cl/conv_bwdf.cl).
# It also stops with "FATAL ERROR ... Unsupported instruction: freeze" on
# LLVM's freeze (emitted e.g. for a signed '/' and '%' of the same operands).
command -v oclgrind >/dev/null 2>&1 || { echo "skip: oclgrind not installed"; exit 77; }
log=${OCLGRIND_CHECK_LOG:-$(mktemp)}
: >"$log"
echo "oclgrind profile: local memory ${OCLGRIND_LOCAL_MEM_SIZE:-default} bytes," \
    "${OCLGRIND_MAX_WGSIZE:-default} work-items per group, ${OCLGRIND_COMPUTE_UNITS:-default} compute units"
if [ -n "$CLGRAD_OCLGRIND_SHIM" ]; then
    [ -f "$CLGRAD_OCLGRIND_SHIM" ] || { echo "CLGRAD_OCLGRIND_SHIM=$CLGRAD_OCLGRIND_SHIM does not exist"; exit 1; }
    # inside oclgrind's wrapper LD_PRELOAD names its runtime: put the shim first
    set -- sh -c 'LD_PRELOAD="$0:$LD_PRELOAD" exec "$@"' "$CLGRAD_OCLGRIND_SHIM" "$@"
fi
CLGRAD_TEST_TINY=1 CLGRAD_CACHE=0 oclgrind --data-races --uninitialized --check-api --log "$log" "$@"
rc=$?
keep() { [ -n "$OCLGRIND_CHECK_LOG" ] || rm -f "$log"; }
if [ -s "$log" ]; then
    echo "oclgrind reported problems (reports per kernel, then the first ones):"
    grep 'Kernel:' "$log" | sort | uniq -c
    head -60 "$log"
    keep
    exit 1
fi
keep
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || { echo "program failed under oclgrind (exit $rc)"; exit 1; }
echo "oclgrind: clean"
