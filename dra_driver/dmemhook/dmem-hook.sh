#!/bin/sh
# dmem-hook: a CDI/OCI createContainer hook of fractional-gpu-dra.
#
# Sets the container's device-memory limits in its cgroup v2 dmem controller
# for the GPU its MPS share is on:
#   hard limit (dmem.max): allocations beyond it fail with out-of-memory
#   soft limit (dmem.min, optional): memory guaranteed to the container; above
#               it the container is borrowing and MPS may evict it under
#               pressure ("MPS v3 Memory Partitioning", "Soft and Hard Limits")
# The container's cgroup does not exist when the kubelet plugin prepares the
# claim, so the container runtime runs this on the host for each container.
#
# How (docs/nvidia-interfaces.md: dmem-set-nvidia-smi, dmem-write-files):
# NVIDIA says to set these limits with `nvidia-smi memory-limits` or NVML, not
# by writing dmem.* files: the driver resolves the region, picks its backend
# (dmem or its internal misc one) and raises every ancestor's dmem.min by the
# leaf's soft limit, since the kernel honours a leaf's dmem.min only where
# every ancestor reserves as much ("Ancestor reservation propagation"). So
# with --gpu and an nvidia-smi that offers the memory-limits subcommand (its
# --help exits 0 and names --hard-limit) the hook runs, as NVIDIA's Dynamo
# guide "Per-GPU Compute and Memory Limits with MPS" does (Option A, step 3):
#   nvidia-smi memory-limits -i <GPU UUID> -n <cgroup dir> \
#     --soft-limit <MiB> --hard-limit <MiB>
# (MiB integers, rounded down; no soft limit asked: 0). Otherwise, or when
# that command fails, it falls back to writing "<region> <bytes>" lines into
# dmem.max/dmem.min, and logs that it did: a direct dmem.min write raises no
# ancestor, so it protects nothing unless every ancestor already reserves as
# much (checked, and warned about). Not verified on a GPU node.
#
# It is plain POSIX sh (the host may have no Python); the kubelet plugin installs
# it into its hook directory (--hook-dir) and names it in the claim's CDI spec.
#
# Usage: dmem-hook.sh [--strict] [--log FILE] [--gpu UUID] --max BYTES [--min BYTES] REGION...
#   REGION   a dmem region of the GPU as /sys/fs/cgroup/dmem.capacity names it,
#            e.g. nvidia/0000:3b:00.0/vidmem or drm/0000:03:00.0/vram0
#   --gpu    the GPU's UUID, for nvidia-smi memory-limits -i (without it the
#            limits are written into the files)
#   --strict a failure exits 1, so the runtime fails the container's start;
#            without it a failure is reported (stderr, --log) and exits 0: the
#            container starts without the kernel-enforced limit (its MPS
#            namespace's pinned memory limit, per client process, still holds)
#   --log    append failures and fallbacks to FILE (kept under 1 MiB: one
#            older file, FILE.1)
# stdin: the OCI state of the container (JSON: "id", "pid", "bundle", ...).
#
# The cgroup: the "0::<path>" line of /proc/<pid>/cgroup. A createContainer hook
# runs in the container's namespaces; with a private cgroup namespace that line
# reads "0::/", so the path then comes from the bundle's config.json
# (linux.cgroupsPath, cgroupfs "/a/b" or systemd "slice:prefix:name" form).
#
# For tests: DMEM_HOOK_CGROUP_ROOT (default /sys/fs/cgroup) and
# DMEM_HOOK_PROC_ROOT (default /proc) point at fake trees; nvidia-smi is looked
# up on PATH.

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
gpu=
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
	--gpu)
		[ $# -ge 2 ] || fail "--gpu needs a GPU UUID"
		gpu=$2
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
	-*) fail "unknown option $1 (usage: dmem-hook.sh [--strict] [--log FILE] [--gpu UUID] --max BYTES [--min BYTES] REGION...)" ;;
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

# docs/nvidia-interfaces.md: dmem-cgroup-lookup
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

# docs/nvidia-interfaces.md: dmem-detect-nvidia-smi (gpu-unverified: the help text is not documented)
memory_limits_offered() {
	# Why nvidia-smi memory-limits cannot be used (stdout), or nothing when it can.
	if [ -z "$gpu" ]; then
		printf 'the hook was given no --gpu'
	elif ! command -v nvidia-smi >/dev/null 2>&1; then
		printf 'no nvidia-smi on PATH (%s)' "$PATH"
	elif ! help=$(nvidia-smi memory-limits --help 2>&1); then
		printf 'this nvidia-smi has no memory-limits subcommand (driver before 615?): %s' \
			"$(printf '%s' "$help" | head -n 1)"
	else
		case $help in
		*--hard-limit*) ;;
		*) printf 'nvidia-smi memory-limits --help does not name --hard-limit' ;;
		esac
	fi
}

# docs/nvidia-interfaces.md: dmem-set-nvidia-smi, dmem-soft-release
set_with_nvidia_smi() {
	# The documented command (Dynamo guide, Option A step 3); MiB, rounded down.
	hard_mib=$((max / 1048576))
	soft_mib=0
	[ -z "$min" ] || soft_mib=$((min / 1048576))
	smi_call="nvidia-smi memory-limits -i $gpu -n $dir --soft-limit $soft_mib --hard-limit $hard_mib"
	if ! out=$(nvidia-smi memory-limits -i "$gpu" -n "$dir" \
		--soft-limit "$soft_mib" --hard-limit "$hard_mib" 2>&1); then
		why="$smi_call failed: $(printf '%s' "${out:-no output}" | tr '\n' ' ')"
		return 1
	fi
	if [ -n "$min" ]; then
		# NVIDIA: a cgroup removed without its soft limit zeroed first leaves its
		# share in the ancestors' dmem.min; a createContainer hook has no later step.
		note "soft limit ${soft_mib} MiB set by nvidia-smi (the driver adds it to every ancestor's dmem.min, where it stays after the container's cgroup is removed)"
	fi
}

# docs/nvidia-interfaces.md: dmem-ancestor-check
ancestor_short_of() {
	# ancestor_short_of REGION BYTES: the first ancestor of the container's cgroup
	# (below the root) whose dmem.min reserves less than BYTES of REGION, with what
	# it reserves; nothing when all reserve enough.
	up=$path
	while :; do
		up=${up%/*}
		[ -n "$up" ] || return 0
		if [ ! -f "$cgroot$up/dmem.min" ]; then
			printf '%s (no dmem.min: +dmem is not in its parent'"'"'s cgroup.subtree_control)' "$up"
			return 0
		fi
		have=$(awk -v r="$1" '$1==r { print $2; exit }' "$cgroot$up/dmem.min")
		case $have in
		max) continue ;;
		'' | *[!0-9]*) have=0 ;;
		esac
		if [ "$have" -lt "$2" ]; then
			printf '%s (dmem.min %s bytes)' "$up" "$have"
			return 0
		fi
	done
}

# docs/nvidia-interfaces.md: dmem-write-files
write_files() {
	# The fallback: "<region> <bytes>" lines straight into dmem.max and dmem.min.
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
		[ -n "$min" ] || continue
		write_limit "$dir/dmem.min" "$region $min" || continue
		short=$(ancestor_short_of "$region" "$min")
		if [ -n "$short" ]; then
			note "warning: dmem.min of $region is $min bytes on $path, but its ancestor $short: the kernel honours a cgroup's dmem.min only where every ancestor reserves as much, so this soft limit protects nothing"
		fi
	done
}

why=$(memory_limits_offered)
if [ -z "$why" ] && set_with_nvidia_smi; then
	finish
fi
note "not using nvidia-smi memory-limits, as NVIDIA's docs advise ($why): writing dmem.max${min:+ and dmem.min} directly, which raises no ancestor's dmem.min"
write_files "$@"
finish
