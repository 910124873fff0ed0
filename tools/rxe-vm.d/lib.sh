# tools/rxe-vm.d/lib.sh: the boot code shared by tools/rxe-vm (one VM) and tools/rxe-vm-pair
# (two VMs on a virtual wire). Sourcing it only defines functions; the caller then runs
#   env_exports=$(env_script)   first thing, before it sets any variable of its own
#   prog=NAME                   the name msg() prints
#   pair=0 or pair=1            one VM, or two joined by a wire (read by vm_setup, prepare_run,
#                               start_vm)
#   vm_setup                    settings, prerequisites, kernel, initramfs, per-run directory
# and then prepare_run / start_vm / start_watchdog / report_vm for each VM.
# shellcheck shell=bash

# export lines for the environment passed to the command: taken first thing, before this
# script sets any variable of its own.
env_script() {
	local n
	for n in $(compgen -e); do
		case $n in
		PATH | HOME | USER | LOGNAME | LANG | LANGUAGE | LC_* | TZ | CI | RDMAXX_* | CATCH_* | *SAN_OPTIONS | IBV_* | RDMAV_*) ;;
		*) [[ " ${RXE_VM_ENV:-} " == *" $n "* ]] || continue ;;
		esac
		printf 'export %s=%q\n' "$n" "${!n}"
	done
}

usage() {
	cat <<'EOF'
usage: tools/rxe-vm [--kernel VERSION] CMD [ARGS...]
       tools/rxe-vm [--kernel VERSION] --pair 'CMD_A' 'CMD_B'   (the same as tools/rxe-vm-pair ...)

--kernel VERSION is RXE_VM_KVER=VERSION (below): `tools/rxe-vm --kernel 6.12 ibv_devinfo`.

Runs CMD where a Soft-RoCE device rxe0 exists and exits with CMD's exit status.
Without an rxe device on the host, boots a throwaway QEMU VM (TCG) of the installed
(or cached) Debian kernel with the host root shared read-only; the command runs as root inside it, in
the same working directory, with rxe0 on dummy0 (192.0.2.1/24) and memlock unlimited.

--pair boots two VMs joined by a QEMU socket network on 127.0.0.1: rxe0 sits on eth0,
192.0.2.1/24 in the first VM (runs CMD_A) and 192.0.2.2/24 in the second (runs CMD_B).
Both commands start once both VMs can reach each other; each gets RXE_VM_PEER set to
the other's address. Commands are run with `bash -c`. Output lines get an "A| " or
"B| " prefix. Exit status: CMD_A's if non-zero, else CMD_B's.

Environment:
  RXE_VM_TIMEOUT=SECS    bound for the whole run, boot included (default 1200); exit 124
  RXE_VM_MEM=MIB         guest memory (default 2048)
  RXE_VM_SMP=N           guest CPUs (default 2; 1 per VM with --pair)
  RXE_VM_KERNEL=PATH     kernel image (default: the newest /boot/vmlinuz-* with its modules,
                         else the newest in the kernel cache, which `tools/dev example` fills)
  RXE_VM_KVER=VERSION    boot the kernel of this version (6.1, 6.12, 6.12.118+deb12-amd64: the
                         newest installed or cached one that matches; `tools/dev kernel VERSION`
                         fetches one into the cache); default: the newest in /boot, else the
                         cache's 6.1. With RXE_VM_KERNEL: that image's version, if it cannot be read
  RXE_VM_MODROOT=DIR     module root: modules in DIR/lib/modules/VERSION (default /); without
                         RXE_VM_KERNEL, the kernel is the newest DIR/boot/vmlinuz-*
  RXE_VM_CACHE=DIR       the kernel cache is DIR/kernel (default ~/.cache/rdmaxx)
  RXE_VM_WRITABLE=D1:D2  absolute host directories mounted writable at the same path
  RXE_VM_ENV="A B"       extra environment variable names to pass into the VM
  RXE_VM_VERBOSE=1       show the guest's console (boot log) on stderr
  RXE_VM_FORCE=1         boot a VM even if the host has an rxe device (so does a RXE_VM_KVER
                         that the host kernel does not match)
  RXE_VM_KEEP=1          keep the per-run directory (console log etc.) for debugging
  RXE_VM_APPEND=ARGS     extra kernel command line arguments
  RXE_VM_QEMU_ARGS=ARGS  extra QEMU arguments (split on blanks)
  RXE_VM_BIOS=PATH       firmware (default: qboot.rom if present; 'default' = SeaBIOS)

Passed into the VM: PATH HOME USER LOGNAME LANG LANGUAGE LC_* TZ CI, RDMAXX_*, CATCH_*,
*SAN_OPTIONS, IBV_*, RDMAV_*, plus RXE_VM=1 and RXE_VM_DEV=rxe0.

Exit status: the command's; 124 timeout; 125 guest kernel panic/oops or VM failure;
127 missing prerequisite (the message names the Debian package).
EOF
}

# kernel_opt ARGS...: a leading --kernel VERSION or --kernel=VERSION exports RXE_VM_KVER=VERSION
# and sets kernel_shift to the number of arguments it took (0 without it).
# shellcheck disable=SC2034 # kernel_shift is read by the caller
kernel_opt() {
	kernel_shift=0
	case "${1-}" in
	--kernel=*) RXE_VM_KVER=${1#--kernel=} kernel_shift=1 ;;
	--kernel)
		if [[ $# -lt 2 || -z $2 ]]; then
			msg "--kernel needs a version: --kernel 6.12"
			exit 2
		fi
		RXE_VM_KVER=$2 kernel_shift=2
		;;
	*) return 0 ;;
	esac
	export RXE_VM_KVER
}

msg() { printf '%s: %s\n' "${prog:-rxe-vm}" "$*" >&2; }
missing() { # missing WHAT PACKAGE
	msg "missing prerequisite: $1 (install the Debian package '$2')"
	exit 127
}

# Version string of a bzImage, read from its setup header (kernel_version field).
bzimage_version() {
	local off
	[[ $(od -An -c -j 514 -N 4 -- "$1" 2>/dev/null | tr -d ' ') == HdrS ]] || return 1
	off=$(od -An -t u2 -j 526 -N 2 -- "$1" | tr -d ' ')
	[[ -n $off && $off != 0 ]] || return 1
	dd if="$1" bs=1 skip=$((off + 512)) count=200 status=none | tr '\0' '\n' | head -n1 | cut -d' ' -f1
}

# A statically linked busybox for the initramfs (busybox-static; the plain 'busybox'
# package is dynamically linked and would not run there).
is_static_elf() {
	local f=$1 phoff phentsize phnum i type
	[[ $(od -An -c -N 4 -- "$f" | tr -d ' ') == '177ELF' ]] || return 1
	phoff=$(od -An -t u8 -j 32 -N 8 -- "$f" | tr -d ' ')
	phentsize=$(od -An -t u2 -j 54 -N 2 -- "$f" | tr -d ' ')
	phnum=$(od -An -t u2 -j 56 -N 2 -- "$f" | tr -d ' ')
	for ((i = 0; i < phnum; i++)); do
		type=$(od -An -t u4 -j $((phoff + i * phentsize)) -N 4 -- "$f" | tr -d ' ')
		[[ $type == 3 ]] && return 1 # PT_INTERP: dynamically linked
	done
	return 0
}

# shellcheck disable=SC2317 # invoked by trap
cleanup() {
	local p
	trap '' INT TERM HUP
	for p in "${qpids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	if [[ -n $watchdog ]]; then kill "$watchdog" 2>/dev/null || true; fi
	for p in "${qpids[@]}" ${watchdog:+"$watchdog"}; do wait "$p" 2>/dev/null || true; done
	for p in "${tailpids[@]}" "${outpids[@]}"; do kill "$p" 2>/dev/null || true; done
	if [[ ${RXE_VM_KEEP:-0} == 1 ]]; then
		msg "kept run directory $top"
	else
		rm -rf -- "$top"
	fi
}

# Escape a value for a QEMU option list (commas are doubled).
qopt() { printf '%s' "${1//,/,,}"; }

# Build the initramfs: static busybox, the 9p modules and a small /init that mounts the
# host root and switch_roots into it, running the guest init script from there.
build_initrd() {
	local d=$top/initramfs path opts
	mkdir -p "$d"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,newroot}
	cp -- "$busybox" "$d/bin/busybox"
	: >"$d/modules"
	while read -r path opts; do
		[[ -n $path ]] || continue
		mkdir -p "$d${path%/*}"
		case $path in
		*.ko) cp -- "$path" "$d$path" ;;
		*.ko.xz) xz -dc -- "$path" >"$d${path%.xz}" || missing xz xz-utils ;;
		*.ko.zst) zstd -qdc -- "$path" >"$d${path%.zst}" || missing zstd zstd ;;
		*.ko.gz) gzip -dc -- "$path" >"$d${path%.gz}" ;;
		*) msg "unexpected module file $path" && exit 125 ;;
		esac
		printf '%s %s\n' "${path%.ko*}.ko" "$opts" >>"$d/modules"
	done <<<"$mods_list"
	cat >"$d/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
die() {
	echo "rxe-vm initramfs: $*"
	echo "RXE-VM-INITRAMFS-FAILED"
	poweroff -f
	echo o >/proc/sysrq-trigger
	sleep 100
}
while read -r path opts; do
	insmod "$path" $opts || die "insmod $path failed"
done </modules
mnt9p() { # tag dir options
	i=0
	until mount -t 9p -o "trans=virtio,version=9p2000.L,msize=262144,$3" "$1" "$2"; do
		i=$((i + 1))
		[ $i -lt 20 ] || die "cannot mount 9p share '$1'"
		sleep 0.1
	done
}
mnt9p hostroot /newroot ro,cache=loose
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /newroot/run || die "cannot mount /run"
mkdir -p /newroot/run/rxe-vm
mnt9p rxevmout /newroot/run/rxe-vm rw,cache=mmap
read -r gi </newroot/run/rxe-vm/guest-init.path || die "no guest-init.path"
# The rest could be left to the guest init, but busybox runs from RAM: faster.
mkdir -p /newroot/run/rxe-vm-host
mount --bind /newroot /newroot/run/rxe-vm-host
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /newroot/tmp
for m in dev proc sys; do
	mount --move /$m /newroot/$m || die "cannot move /$m"
done
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /newroot/dev/shm
# via the host view: a guest init under /tmp is hidden by the tmpfs there
exec switch_root /newroot /bin/bash "/run/rxe-vm-host$gi"
EOF
	chmod 755 "$d/init"
	(cd "$d" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >"$initrd"
	rm -rf -- "$d"
}

# prepare_run IDX ADDR PEER -- CMD...: writes the run dir consumed by guest-init
prepare_run() {
	local idx=$1 addr=$2 peer=$3 run=$top/vm$1
	shift 4
	mkdir -p "$run"
	printf '%s\n' "$guest_init" >"$run/guest-init.path"
	{
		printf 'RXEVM_MODE=%q\n' "$([[ ${pair:-0} == 1 ]] && echo pair || echo single)"
		printf 'RXEVM_ADDR=%q\n' "$addr"
		printf 'RXEVM_PEER=%q\n' "$peer"
		printf 'RXEVM_CWD=%q\n' "$cwd"
		printf 'RXEVM_MODROOT=%q\n' "$modroot"
		printf 'RXEVM_VERBOSE=%q\n' "$verbose"
		printf 'RXEVM_WRITABLE=('
		[[ ${#writable[@]} -gt 0 ]] && printf '%q ' "${writable[@]}"
		printf ')\n'
	} >"$run/config.sh"
	{
		echo '# generated by tools/rxe-vm'
		[[ -n $env_exports ]] && printf '%s\n' "$env_exports"
		echo 'export RXE_VM=1 RXE_VM_DEV=rxe0'
		[[ -n $peer ]] && printf 'export RXE_VM_PEER=%q\n' "$peer"
		printf 'cd -- %q || exit 126\n' "$cwd"
		printf 'exec'
		printf ' %q' "$@"
		printf '\n'
	} >"$run/cmd.sh"
}

# start_vm IDX [extra qemu args...]: boots the VM in the background
start_vm() {
	local idx=$1 run=$top/vm$1 i
	shift
	local append="console=ttyS0 panic=-1 oops=panic quiet loglevel=3 mitigations=off tsc=reliable no_timer_check edd=off ${RXE_VM_APPEND:-}"
	[[ $verbose == 1 ]] && append=${append/ quiet loglevel=3/}
	# shellcheck disable=SC2054 # commas belong to QEMU options
	local cmd=("$qemu" -nodefaults -nographic -no-reboot
		-machine pc -accel tcg,thread=multi -cpu max -smp "$smp" -m "$mem"
		-kernel "$kernel" -initrd "$initrd" -append "$append"
		-chardev "file,id=con,path=$(qopt "$run/console.log")" -serial chardev:con
		-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap
		-virtfs "local,path=$(qopt "$run"),mount_tag=rxevmout,security_model=none,multidevs=remap")
	for i in "${!writable[@]}"; do
		cmd+=(-virtfs "local,path=$(qopt "${writable[$i]}"),mount_tag=rxevmw$i,security_model=none,multidevs=remap")
	done
	# qboot starts the kernel ~2 s sooner than SeaBIOS under TCG
	local bios=${RXE_VM_BIOS:-/usr/share/qemu/qboot.rom}
	if [[ $bios != default && -r $bios ]]; then cmd+=(-bios "$bios"); fi
	cmd+=("$@")
	# shellcheck disable=SC2206 # extra arguments are split on blanks on purpose
	[[ -n ${RXE_VM_QEMU_ARGS:-} ]] && cmd+=(${RXE_VM_QEMU_ARGS})
	: >"$run/console.log"
	: >"$run/output"
	# QEMU gets SIGKILL when the front end dies (setpriv --pdeathsig, util-linux): the EXIT trap
	# (cleanup) stops the VMs on every exit the shell sees, but a front end killed with SIGKILL
	# runs no trap, and its VMs would run on until their command ends, if ever.
	local pdeath=()
	if command -v setpriv >/dev/null; then pdeath=(setpriv --pdeathsig KILL); fi
	"${pdeath[@]}" "${cmd[@]}" </dev/null >"$run/qemu.err" 2>&1 &
	qpids[idx]=$!
	# The guest writes the command's output to $run/output (9p); stream it from there.
	if [[ ${pair:-0} == 1 ]]; then
		local tag
		tag=$([[ $idx == 0 ]] && echo A || echo B)
		tail -s 0.1 -n +1 -f --pid="${qpids[idx]}" -- "$run/output" | sed -u "s/^/$tag| /" &
	else
		tail -s 0.1 -n +1 -f --pid="${qpids[idx]}" -- "$run/output" &
	fi
	outpids+=($!)
	if [[ $verbose == 1 ]]; then
		tail -s 0.1 -n +1 -f --pid="${qpids[idx]}" -- "$run/console.log" 2>/dev/null |
			sed -u 's/\r$//; s/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g'"; s/^/[vm$idx console] /" >&2 &
		tailpids+=($!)
	fi
}

# Console log without carriage returns and the firmware's terminal escapes.
clean_console() {
	tr -d '\r' <"$1" | sed 's/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g'
}

# Report on one VM after it stopped; sets vm_rc.
panic_re='Kernel panic|BUG:|Oops|general protection'
# shellcheck disable=SC2034 # vm_rc is read by the caller
report_vm() {
	local idx=$1 run=$top/vm$1 name=$2 first st
	vm_rc=0
	if first=$(grep -a -n -m1 -E "$panic_re" "$run/console.log" | cut -d: -f1) && [[ -n $first ]]; then
		msg "${name}guest kernel panic/oops detected; console log:"
		clean_console "$run/console.log" | sed -n "$((first > 10 ? first - 10 : 1)),$((first + 60))p" >&2
		vm_rc=125
		return
	fi
	if [[ -e $top/timed-out ]]; then
		vm_rc=124
		return
	fi
	if [[ -s $run/setup-failed ]]; then
		msg "${name}VM setup failed: $(head -n1 "$run/setup-failed")"
		[[ -s $run/setup.log ]] && tail -n 30 "$run/setup.log" >&2
		vm_rc=125
		return
	fi
	st=$(cat "$run/status" 2>/dev/null || true)
	if [[ $st =~ ^[0-9]+$ ]]; then
		vm_rc=$st
		return
	fi
	if [[ -e $run/stopped ]]; then
		msg "${name}stopped 10s after the other VM failed"
		vm_rc=125
		return
	fi
	msg "${name}VM stopped without reporting an exit status (qemu exit ${qrcs[idx]:-?})"
	[[ -s $run/qemu.err ]] && sed 's/^/qemu: /' "$run/qemu.err" >&2
	[[ -s $run/setup.log ]] && tail -n 20 "$run/setup.log" | sed 's/^/setup: /' >&2
	msg "last console lines:"
	clean_console "$run/console.log" | tail -n 30 >&2
	vm_rc=125
}

# ---------------------------------------------------------------- run
# start_watchdog: at RXE_VM_TIMEOUT, mark the run timed out and stop every VM (SIGTERM, SIGKILL
# 5 s later). Call it after the last start_vm: the watchdog is a subshell, it knows the VMs that
# qpids holds when it forks and no later one (a watchdog started before the VMs kills nothing).
# It checks the front end once a second: if that was killed outright (SIGKILL, no trap ran), its
# VMs died with it (start_vm's parent-death signal) and the watchdog leaves, rather than signal
# their process ids after they may have been reused.
start_watchdog() {
	if [[ ${#qpids[@]} -eq 0 ]]; then
		msg "internal error: start_watchdog before start_vm"
		exit 125
	fi
	local front=$$ deadline=$((SECONDS + timeout_s))
	(
		trap 'kill $sp 2>/dev/null; exit 0' TERM
		while ((SECONDS < deadline)); do
			kill -0 "$front" 2>/dev/null || exit 0
			sleep 1 &
			sp=$!
			wait $sp
		done
		touch "$top/timed-out"
		kill "${qpids[@]}" 2>/dev/null
		sleep 5 &
		sp=$!
		wait $sp
		kill -9 "${qpids[@]}" 2>/dev/null
	) </dev/null >/dev/null 2>&1 &
	watchdog=$!
}

# The kernel cache: where `tools/dev example` unpacks Debian's kernel package when no kernel is
# installed (one directory per package version, DIR/boot/vmlinuz-KVER and DIR/lib/modules/KVER,
# depmod'ed there). The VM's kernel is a test artifact: it needs no initramfs, no bootloader
# hook and no place in /boot.
kernel_cache() {
	printf '%s\n' "${RXE_VM_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/rdmaxx}/kernel"
}

# usable_kernel ROOT KVER: ROOT/lib/modules/KVER has the modules the VM loads.
usable_kernel() {
	local m
	[[ -f $1/lib/modules/$2/modules.dep ]] || return 1
	for m in virtio_pci 9pnet_virtio 9p rdma_rxe; do
		"$modprobe" -d "$1" -S "$2" --show-depends "$m" >/dev/null 2>&1 || return 1
	done
}

# The kernel series the VM boots when none is asked for and none is installed in /boot: the one
# the project's tests are measured on (docs/kernels.md). `tools/dev example` fetches it.
default_kver=6.1

# kver_matches VERSION WANT: VERSION (a kernel release, 6.12.118+deb12-amd64) is WANT, or WANT
# followed by '.' or '-': 6.12 matches 6.12.118+deb12-amd64, 6.1 matches 6.1.0-57-amd64 and not 6.12.
kver_matches() {
	[[ $1 == "$2" || $1 == "$2".* || $1 == "$2"-* ]]
}

# find_kernel: sets kernel (the image), kver and modroot (modules in modroot/lib/modules/kver):
# RXE_VM_KERNEL (modules under RXE_VM_MODROOT, default /; RXE_VM_KVER is then its version);
# else the newest RXE_VM_MODROOT/boot/vmlinuz-*; else the newest installed /boot/vmlinuz-* with
# its modules, then the newest of the default series in the kernel cache, then the cache's newest.
# Without RXE_VM_KERNEL, RXE_VM_KVER=VER takes only kernels whose version matches VER
# (kver_matches). Exits 127 (missing) or 2 (bad setting).
find_kernel() {
	local k v root want=''
	kernel='' kver='' modroot=${RXE_VM_MODROOT:-/}
	if [[ $modroot != /* || ! -d $modroot ]]; then
		msg "RXE_VM_MODROOT '$modroot' is not an absolute path to an existing directory"
		exit 2
	fi
	modroot=$(readlink -f -- "$modroot")
	if [[ -n ${RXE_VM_KERNEL:-} ]]; then
		kernel=$RXE_VM_KERNEL
		[[ -f $kernel ]] || missing "kernel image $kernel (RXE_VM_KERNEL)" linux-image-amd64
		kver=${RXE_VM_KVER:-}
		if [[ -z $kver ]]; then
			case ${kernel##*/} in
			vmlinuz-?*) kver=${kernel##*/vmlinuz-} ;;
			*) kver=$(bzimage_version "$kernel" || true) ;;
			esac
		fi
		[[ -n $kver ]] || {
			msg "cannot tell the version of $kernel; set RXE_VM_KVER"
			exit 2
		}
	else
		want=${RXE_VM_KVER:-}
		if [[ -n $want && ! $want =~ ^[0-9]+(\.[0-9]+)*([.+~-][A-Za-z0-9.+~-]*)?$ ]]; then
			msg "bad kernel version '$want' (RXE_VM_KVER or --kernel; for example 6.1 or 6.12)"
			exit 2
		fi
		while IFS= read -r k; do
			v=${k##*/vmlinuz-}
			root=${k%/boot/vmlinuz-*}
			[[ -z $want ]] || kver_matches "$v" "$want" || continue
			if usable_kernel "${root:-/}" "$v"; then
				kernel=$k kver=$v modroot=${root:-/}
				break
			fi
		done < <(
			# (no match is no error: errexit holds in this subshell too)
			if [[ -n ${RXE_VM_MODROOT:-} ]]; then
				compgen -G "${modroot%/}/boot/vmlinuz-*" | sort -rV || true
			else
				compgen -G '/boot/vmlinuz-*' | sort -rV || true
				# The cache may hold several series (tools/dev kernel VER): without a version asked
				# for, the default series comes first, so that fetching another one does not change
				# what a plain run boots.
				compgen -G "$(kernel_cache)/*/boot/vmlinuz-${default_kver}[.-]*" | sort -rV || true
				compgen -G "$(kernel_cache)/*/boot/vmlinuz-*" | sort -rV || true
			fi
		)
		if [[ -z $kernel && -n $want ]]; then
			msg "missing prerequisite: a kernel $want with rdma_rxe \
($([[ -n ${RXE_VM_MODROOT:-} ]] && echo "in ${modroot%/}/boot" || echo "in /boot or $(kernel_cache)")); \
\`tools/dev kernel $want\` fetches Debian's package into the kernel cache (not installed)"
			exit 127
		fi
		if [[ -z $kernel && -n ${RXE_VM_MODROOT:-} ]]; then
			missing "a kernel with rdma_rxe in ${modroot%/}/boot, modules in ${modroot%/}/lib/modules \
(RXE_VM_MODROOT)" linux-image-amd64
		fi
		[[ -n $kernel ]] || missing "a kernel with rdma_rxe: in /boot/vmlinuz-* with its /lib/modules dir, \
or in $(kernel_cache) (tools/dev example puts one there)" linux-image-amd64
	fi
	[[ -r $kernel ]] || {
		msg "cannot read the kernel image $kernel (run as root)"
		exit 127
	}
	moddir=${modroot%/}/lib/modules/$kver
	[[ -f $moddir/modules.dep ]] || missing "kernel modules dir $moddir" "linux-image-$kver"
}

# vm_setup: read the settings (RXE_VM_*), check the prerequisites, find the kernel, its modules
# and a static busybox, create the per-run directory (removed on exit: traps set here) and build
# the initramfs. Exits with 2 (bad setting) or 127 (missing prerequisite, named).
vm_setup() {
	# ---------------------------------------------------------------- settings
	timeout_s=${RXE_VM_TIMEOUT:-1200}
	mem=${RXE_VM_MEM:-2048}
	if [[ ${pair:-0} == 1 ]]; then smp=${RXE_VM_SMP:-1}; else smp=${RXE_VM_SMP:-2}; fi
	verbose=${RXE_VM_VERBOSE:-0}
	for v in timeout_s mem smp; do
		if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
			msg "bad value '${!v}' for $v (want a positive integer)"
			exit 2
		fi
	done

	guest_init=$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/guest-init
	[[ -r $guest_init ]] || {
		msg "guest init script $guest_init is missing"
		exit 127
	}
	cwd=$(pwd -P)

	# ---------------------------------------------------------------- prerequisites
	qemu=$(command -v qemu-system-x86_64 || true)
	[[ -n $qemu ]] || missing qemu-system-x86_64 qemu-system-x86
	command -v cpio >/dev/null || missing cpio cpio
	modprobe=$(command -v modprobe || echo /sbin/modprobe)
	[[ -x $modprobe ]] || missing modprobe kmod
	command -v ip >/dev/null || missing ip iproute2
	command -v rdma >/dev/null || missing rdma iproute2
	[[ -e /etc/libibverbs.d/rxe.driver ]] || missing 'libibverbs rxe provider' ibverbs-providers
	command -v ibv_devinfo >/dev/null || missing ibv_devinfo ibverbs-utils
	command -v ss >/dev/null || missing ss iproute2

	find_kernel
	busybox=''
	for b in ${RXE_VM_BUSYBOX:-} /bin/busybox /usr/bin/busybox; do
		if [[ -x $b ]] && is_static_elf "$b"; then
			busybox=$b
			break
		fi
	done
	[[ -n $busybox ]] || missing 'statically linked busybox' busybox-static

	# Modules the initramfs needs to mount the 9p share over virtio-pci, in load order.
	mods_list=''
	declare -A seen_mod=()
	for m in virtio_pci 9pnet_virtio 9p; do
		deps=$("$modprobe" -d "$modroot" -S "$kver" --show-depends "$m" 2>/dev/null) ||
			missing "kernel module $m for $kver" "linux-image-$kver"
		while read -r kind path opts; do
			[[ $kind == insmod && -z ${seen_mod[$path]:-} ]] || continue
			seen_mod[$path]=1
			mods_list+="$path $opts"$'\n'
		done <<<"$deps"
	done
	"$modprobe" -d "$modroot" -S "$kver" --show-depends rdma_rxe >/dev/null 2>&1 ||
		missing "kernel module rdma_rxe for $kver" "linux-image-$kver"

	# ---------------------------------------------------------------- writable shares
	writable=()
	if [[ -n ${RXE_VM_WRITABLE:-} ]]; then
		IFS=: read -r -a wlist <<<"$RXE_VM_WRITABLE"
		for w in "${wlist[@]}"; do
			[[ -n $w ]] || continue
			if [[ $w != /* || ! -d $w ]]; then
				msg "RXE_VM_WRITABLE entry '$w' is not an absolute path to an existing directory"
				exit 2
			fi
			writable+=("$(readlink -f -- "$w")")
		done
	fi

	# ---------------------------------------------------------------- per-run state
	top=$(mktemp -d "${TMPDIR:-/tmp}/rxe-vm.XXXXXX")
	top=$(readlink -f -- "$top")
	qpids=()
	watchdog=''
	tailpids=()
	outpids=()

	trap cleanup EXIT
	trap 'trap "" INT TERM HUP; msg interrupted; exit 130' INT
	trap 'trap "" INT TERM HUP; msg terminated; exit 143' TERM HUP

	initrd=$top/initrd.cpio
	build_initrd
}
