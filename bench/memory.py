"""Peak-memory helpers shared by the benchmarks (Linux /proc)."""


def status_mib(field: str) -> float:
    """A memory field of /proc/self/status in MiB, e.g. "VmRSS" or "VmHWM" (peak RSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> float:
    """Reset the peak RSS (VmHWM) to the current RSS; return the current RSS in MiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_mib("VmRSS")
