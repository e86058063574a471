#!/bin/sh
# dmem-hook: a CDI/OCI createContainer hook of fractional-gpu-dra.
#
# Sets the container's device-memory limit in its cgroup v2 dmem controller
# for the dmem region(s) of the GPU its MPS share is on:
#   dmem.max <- the hard limit (allocations beyond it fail with out-of-memory)
#   dmem.min <- the optional soft limit (NVIDIA's MPS v3 memory partitioning maps
#               its soft limit to dmem.min: memory kept for the container; above
#               it the container may be evicted under pressure)
# The container's cgroup does not exist when the kubelet plugin prepares the
# claim, so the container runtime runs this on the host for each container.
#
# It is plain POSIX sh (the host may have no Python); the kubelet plugin installs
# it into its hook directory (--hook-dir) and names it in the claim's CDI spec.
#
# Usage: dmem-hook.sh [--strict] [--log FILE] --max BYTES [--min BYTES] REGION...
#   REGION   a dmem region of the GPU as /sys/fs/cgroup/dmem.capacity names it,
#            e.g. nvidia/0000:3b:00.0/vidmem or drm/0000:03:00.0/vram0
#   --strict a failure exits 1, so the runtime fails the container's start;
#            without it a failure is reported (stderr, --log) and exits 0: the
#            container starts without the kernel-enforced limit (the MPS
#            daemon's per-namespace limit still holds)
#   --log    append failures to FILE (kept under 1 MiB: one older file, FILE.1)
# stdin: the OCI state of the container (JSON: "id", "pid", "bundle", ...).
#
# The cgroup: the "0::<path>" line of /proc/<pid>/cgroup. A createContainer hook
# runs in the container's namespaces; with a private cgroup namespace that line
# reads "0::/", so the path then comes from the bundle's config.json
# (linux.cgroupsPath, cgroupfs "/a/b" or systemd "slice:prefix:name" form).
#
# For tests: DMEM_HOOK_CGROUP_ROOT (default /sys/fs/cgroup) and
# DMEM_HOOK_PROC_ROOT (default /proc) point at fake trees.

set -u
set -f
# A runtime runs hooks with only the environment the hook names (none here).
: "${PATH:=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}"
export PATH

cgroot=${DMEM_HOOK_CGROUP_ROOT:-/sys/fs/cgroup}
procroot=${DMEM_HOOK_PROC_ROOT:-/proc}
strict=0
logfile=
max=
min=
id=unknown
problems=0

note() {
	# One line to stderr and, when asked, to the log file.
	printf 'dmem-hook: container %s: %s\n' "$id" "$1" >&2
	if [ -n "$logfile" ]; then
		if [ -f "$logfile" ] && [ "$(wc -c <"$logfile")" -gt 1048576 ]; then
			mv -f "$logfile" "$logfile.1" 2>/dev/null
		fi
		printf '%s dmem-hook: container %s: %s\n' \
			"$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$id" "$1" >>"$logfile" 2>/dev/null
	fi
}

finish() {
	# Exit after the problems counted so far: 1 only when strict.
	if [ "$problems" -gt 0 ]; then
		if [ "$strict" = 1 ]; then
			exit 1
		fi
		note "not strict: the container starts without the kernel device-memory limit"
	fi
	exit 0
}

fail() {
	problems=$((problems + 1))
	note "error: $1"
	finish
}

is_bytes() {
	case $1 in
	'' | *[!0-9]*) return 1 ;;
	*) return 0 ;;
	esac
}

while [ $# -gt 0 ]; do
	case $1 in
	--strict) strict=1 ;;
	--log)
		[ $# -ge 2 ] || fail "--log needs a file"
		logfile=$2
		shift
		;;
	--max)
		[ $# -ge 2 ] || fail "--max needs a byte count"
		max=$2
		shift
		;;
	--min)
		[ $# -ge 2 ] || fail "--min needs a byte count"
		min=$2
		shift
		;;
	--) shift && break ;;
	-*) fail "unknown option $1 (usage: dmem-hook.sh [--strict] [--log FILE] --max BYTES [--min BYTES] REGION...)" ;;
	*) break ;;
	esac
	shift
done

is_bytes "$max" || fail "--max must be a byte count, got '$max'"
[ -z "$min" ] || is_bytes "$min" || fail "--min must be a byte count, got '$min'"
[ $# -gt 0 ] || fail "no dmem region given"

# The OCI state (one JSON object; a runtime may print it on several lines).
state=$(tr -d '\n\r' 2>/dev/null)
id=$(printf '%s' "$state" | sed -n 's/.*"id"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')
[ -n "$id" ] || id=unknown
pid=$(printf '%s' "$state" | sed -n 's/.*"pid"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p')
bundle=$(printf '%s' "$state" | sed -n 's/.*"bundle"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')
[ -n "$pid" ] || fail "the OCI state on stdin has no \"pid\" (is this run as a createContainer hook?)"

if [ ! -f "$cgroot/cgroup.controllers" ]; then
	fail "$cgroot is not a cgroup v2 (unified) hierarchy: cgroup.controllers is missing (a cgroup v1 or hybrid host); the dmem controller needs cgroup v2"
fi
if ! grep -qw dmem "$cgroot/cgroup.controllers"; then
	fail "the kernel has no dmem cgroup controller ($cgroot/cgroup.controllers: $(cat "$cgroot/cgroup.controllers")); it needs Linux 6.14 or newer built with CONFIG_CGROUP_DMEM"
fi

expand_slice() {
	# systemd slice name to its path: a-b-c.slice -> /a.slice/a-b.slice/a-b-c.slice
	name=${1%.slice}
	if [ -z "$name" ] || [ "$name" = "-" ]; then
		printf '/'
		return
	fi
	out=
	acc=
	saved_ifs=$IFS
	IFS=-
	for part in $name; do
		if [ -z "$acc" ]; then acc=$part; else acc="$acc-$part"; fi
		out="$out/$acc.slice"
	done
	IFS=$saved_ifs
	printf '%s' "$out"
}

cgroup_from_bundle() {
	[ -n "$bundle" ] && [ -f "$bundle/config.json" ] || return 1
	spec=$(tr -d '\n\r' <"$bundle/config.json" |
		sed -n 's/.*"cgroupsPath"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')
	[ -n "$spec" ] || return 1
	case $spec in
	*:*:*)
		slice=${spec%%:*}
		rest=${spec#*:}
		prefix=${rest%%:*}
		unit=${rest#*:}
		case $unit in
		*.slice) ;;
		*) if [ -n "$prefix" ]; then unit="$prefix-$unit.scope"; else unit="$unit.scope"; fi ;;
		esac
		base=$(expand_slice "$slice")
		[ "$base" = / ] && base=
		printf '%s/%s' "$base" "$unit"
		;;
	/*) printf '%s' "$spec" ;;
	*) printf '/%s' "$spec" ;;
	esac
}

[ -r "$procroot/$pid/cgroup" ] || fail "cannot read $procroot/$pid/cgroup (the container's process $pid)"
if ! grep -q '^0::' "$procroot/$pid/cgroup"; then
	fail "$procroot/$pid/cgroup has no cgroup v2 entry (0::/...): the container is not in a unified cgroup hierarchy (cgroup v1)"
fi
path=$(sed -n 's/^0::\(.*\)$/\1/p' "$procroot/$pid/cgroup" | head -n 1)
if [ -z "$path" ] || [ "$path" = / ]; then
	# A private cgroup namespace shows its own root; ask the bundle.
	path=$(cgroup_from_bundle) ||
		fail "process $pid shows cgroup '/' (a private cgroup namespace) and the bundle's config.json ($bundle) has no linux.cgroupsPath"
fi
dir="$cgroot$path"
[ -d "$dir" ] || fail "the container's cgroup $dir does not exist"
if [ ! -f "$dir/dmem.max" ]; then
	fail "the dmem controller is not enabled for $path ($dir has no dmem.max): enable it in cgroup.subtree_control of each parent cgroup (echo +dmem > .../cgroup.subtree_control), or turn the hook off (--dmem-limits=off)"
fi

write_limit() {
	# write_limit FILE LINE: one nested-keyed line; a failure is counted and noted.
	if ! err=$({ printf '%s\n' "$2" >"$1"; } 2>&1); then
		problems=$((problems + 1))
		note "error: writing '$2' to $1 failed: ${err:-no reason given}"
		return 1
	fi
}

capacity=$(cat "$cgroot/dmem.capacity" 2>/dev/null)
for region in "$@"; do
	case "
$capacity" in
	*"
$region "*) ;;
	*)
		problems=$((problems + 1))
		note "error: dmem region $region is not registered ($cgroot/dmem.capacity lists: $(printf '%s\n' "$capacity" | cut -d' ' -f1 | tr '\n' ' ')); its limit is not set"
		continue
		;;
	esac
	write_limit "$dir/dmem.max" "$region $max" || continue
	[ -z "$min" ] || write_limit "$dir/dmem.min" "$region $min"
done
finish
