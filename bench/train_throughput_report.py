"""Reporting for ``bench/train_throughput.py``: machine info, per-row statistics, the table and the README snippet."""

from __future__ import annotations

import os
import platform


def row_name(row):
    return row["stack"]


def median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def summarise(rows, peaks, quiet_share):
    """Adds tokens/s, ms/step, CPU s/step, MFU and the ratios vs keras-hub and torch to each row.

    Within one preset × precision, the medians are over the quiet steps if every row has at least
    half its steps quiet, else over all steps (the same rule for every stack, so ratios stay fair).
    """
    from gpt_tf.config import get_preset

    groups = {}
    for row in rows:
        groups.setdefault((row["preset"], row["precision"]), []).append(row)
    for group in groups.values():
        quiet = {id(r): [s for s in r["steps_log"] if s["others_cpu_share"] <= quiet_share] for r in group}
        use_quiet = all(2 * len(quiet[id(r)]) >= max(len(r["steps_log"]), 1) for r in group)
        for row in group:
            steps = quiet[id(row)] if use_quiet else row["steps_log"]
            row["quiet_steps"], row["used_steps"] = len(quiet[id(row)]), "quiet" if use_quiet else "all"
            row["ms_per_step"] = 1e3 * median([s["s"] for s in steps])
            row["cpu_s_per_step"] = median([s["cpu_s"] for s in steps])
            row["tokens_per_s"] = row["batch"] * row["seq"] / (row["ms_per_step"] / 1e3)
            row["flops_per_token"] = get_preset(row["preset"]).flops_per_token(row["seq"])
            row["mfu"] = row["tokens_per_s"] * row["flops_per_token"] / peaks[row["precision"]]
            row["others_cpu_share"] = sum(s["others_cpu_share"] for s in row["steps_log"]) / len(row["steps_log"])
            row["final_loss"] = row["steps_log"][-1]["loss"]
        for row in group:
            for ref in ("keras_hub", "torch"):
                other = [r for r in group if r["stack"] == ref]
                if other:
                    row[f"vs_{ref}"] = row["tokens_per_s"] / other[0]["tokens_per_s"]
                    row[f"cpu_vs_{ref}"] = other[0]["cpu_s_per_step"] / row["cpu_s_per_step"]


def table_lines(rows):
    """The results as markdown table lines."""
    lines = [
        "| preset | precision | stack | batch × seq | params | tokens/s | ms/step | MFU | vs keras-hub | vs torch "
        "| CPU s/step | others' CPU | steps used |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ratio = {k: f"{r[k]:.2f}×" if k in r else "–" for k in ("vs_keras_hub", "vs_torch")}
        lines.append(
            f"| {r['preset']} | {r['precision']} | {row_name(r)} | {r['batch']} × {r['seq']} | {r['n_params']:,} "
            f"| {r['tokens_per_s']:,.0f} | {r['ms_per_step']:,.0f} | {100 * r['mfu']:.1f}% "
            f"| {ratio['vs_keras_hub']} | {ratio['vs_torch']} | {r['cpu_s_per_step']:.2f} "
            f"| {100 * r['others_cpu_share']:.0f}% "
            f"| {r['used_steps']} ({r['quiet_steps']}/{len(r['steps_log'])} quiet) |"
        )
    return lines


def markdown(report):
    """The README snippet: the command, the machine, the measured peaks and the table."""
    m, peaks = report["machine"], report["peak_flops"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    return (
        "\n".join(
            [
                "```bash",
                report["command"],
                "```",
                "",
                f"Measured {report['date']} on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB, "
                f"{' '.join(m['isa'])}); {versions}.",
                f"MFU = tokens/s × `flops_per_token` (6N + 12·L·d·T) / peak, where peak is the matmul FLOP/s "
                f"measured in the same run (best of TF and torch over square matmuls of sizes "
                f"{report['peak_matmul_sizes']}): "
                + ", ".join(f"{p} {v / 1e9:.0f} GFLOP/s" for p, v in peaks.items())
                + ".",
                f"A step is forward + backward + global-norm clip + AdamW with dropout on, on one identical random "
                f"batch (torch: `torch.optim.AdamW`, `{report['torch_adamw']}` implementation); "
                f"each stack runs in its own process, schedule `{report['schedule']}`. This is a shared machine: "
                f'"others\' CPU" is the mean share of its CPU time that other processes used during the timed steps; '
                f"ms/step and CPU s/step (our process's own CPU time) are medians over the quiet steps (others ≤ "
                f"{100 * report['quiet_share']:.0f}%) when every stack of the preset × precision has at least half its "
                f'steps quiet, otherwise over all steps ("steps used").',
                "",
                *table_lines(report["rows"]),
            ]
        )
        + "\n"
    )


def machine_info():
    """CPU model, core count, memory and library versions of this machine."""
    from importlib import metadata

    with open("/proc/cpuinfo") as f:
        cpuinfo = f.read().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "unknown CPU")
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    versions = {}
    for package in ("tensorflow", "keras", "keras-hub", "torch", "transformers", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "isa": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags],
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "versions": versions,
        "loadavg_at_start": os.getloadavg(),
    }
