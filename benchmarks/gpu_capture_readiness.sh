#!/usr/bin/env bash
# Records, read-only, what the node-readiness checks read (issue 36) on a real GPU machine, as raw
# text for the parsers' tests: nvidia-smi's fabric, row-remapper, retired-page and persistence
# sections, the loaded modules (nvidia_peermem, dma-buf), the memlock limit, IOMMU mode, PCIe ACS
# capability lines, AER counters and link speed/width from sysfs, D-state processes, Fabric
# Manager's service and log, and XID/SXid kernel lines. Every command has its own short timeout and
# may fail (a container lacks lspci or dmesg rights): its file then says so.
#
#   bash benchmarks/gpu_capture_readiness.sh     # writes $OUT/readiness.tar.gz (or a temp dir's)
set -uo pipefail
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/readiness-out.XXXXXX")}
DIR=$(mktemp -d "${TMPDIR:-/tmp}/readiness.XXXXXX")/readiness
mkdir -p "$DIR" "$OUT"
grab() { # grab NAME COMMAND...: stdout+stderr and the exit status into NAME.txt
  local name=$1
  shift
  { echo "\$ $*"; timeout 20 "$@" 2>&1; echo "[exit $?]"; } >"$DIR/$name.txt"
}
grab smi-q nvidia-smi -q
grab smi-row-remapper nvidia-smi -q -d ROW_REMAPPER
grab smi-page-retirement nvidia-smi -q -d PAGE_RETIREMENT
grab smi-ecc nvidia-smi -q -d ECC
grab smi-performance nvidia-smi -q -d PERFORMANCE
grab smi-query-fields nvidia-smi --help-query-gpu
grab smi-query nvidia-smi --format=csv --query-gpu=index,pci.bus_id,persistence_mode,mig.mode.current,retired_pages.pending,remapped_rows.pending,remapped_rows.failure,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max
grab smi-nvlink-status nvidia-smi nvlink -s
grab smi-nvlink-errors nvidia-smi nvlink -e
grab smi-topo nvidia-smi topo -m
grab lsmod lsmod
grab proc-modules cat /proc/modules
grab modinfo-peermem modinfo nvidia_peermem
grab limits cat /proc/self/limits
grab ulimit-l bash -c 'ulimit -l'
grab cmdline cat /proc/cmdline
grab iommu-class ls -l /sys/class/iommu
grab iommu-groups bash -c 'ls /sys/kernel/iommu_groups | wc -l; for g in /sys/kernel/iommu_groups/*/type; do echo "$g: $(cat "$g")"; done 2>/dev/null | head -50'
grab lspci-vvv lspci -vvv
grab lspci-tree lspci -tv
grab driver-version cat /proc/driver/nvidia/version
grab driver-gpus bash -c 'for f in /proc/driver/nvidia/gpus/*/information; do echo "== $f"; cat "$f"; done'
grab driver-params cat /proc/driver/nvidia/params
grab dstate ps -eo state,pid,wchan:32,comm
grab fabricmanager-service bash -c 'systemctl is-active nvidia-fabricmanager; systemctl status nvidia-fabricmanager --no-pager; pgrep -a nv-fabricmanager'
grab fabricmanager-log bash -c 'tail -n 200 /var/log/fabricmanager.log'
grab dmesg-nvidia bash -c 'dmesg -T | grep -iE "xid|sxid|nvswitch|nvidia|iommu|dmar|aer" | tail -n 300'
grab journal-xid bash -c 'journalctl -k --no-pager | grep -iE "xid|sxid" | tail -n 100'
# sysfs, per PCI device: class, vendor, link speed/width (current and max), AER counters, ACS bits
grab sysfs-pci bash -c 'for d in /sys/bus/pci/devices/*; do echo "== $d"; for f in class vendor device current_link_speed max_link_speed current_link_width max_link_width aer_dev_correctable aer_dev_fatal aer_dev_nonfatal numa_node; do [ -r "$d/$f" ] && echo "$f: $(tr "\n" " " < "$d/$f")"; done; done'
grab sysfs-infiniband bash -c 'for p in /sys/class/infiniband/*/ports/*; do echo "== $p"; for f in state phys_state rate link_layer; do [ -r "$p/$f" ] && echo "$f: $(cat "$p/$f")"; done; done'
grab python-nvml python3 -c 'import pynvml as n; n.nvmlInit(); print("driver", n.nvmlSystemGetDriverVersion()); h = n.nvmlDeviceGetHandleByIndex(0); print("persistence", n.nvmlDeviceGetPersistenceMode(h)); print("remapped rows", n.nvmlDeviceGetRemappedRows(h)); print("fabric", getattr(n, "nvmlDeviceGetGpuFabricInfo", None) and n.nvmlDeviceGetGpuFabricInfo(h))'
tar -C "$(dirname "$DIR")" -czf "$OUT/readiness.tar.gz" readiness
echo "gpu_capture_readiness: $(ls "$DIR" | wc -l) files, $(stat -c %s "$OUT/readiness.tar.gz") bytes -> $OUT/readiness.tar.gz"
