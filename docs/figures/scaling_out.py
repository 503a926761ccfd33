"""Draws docs/figures/scaling_out.png: what runs where under each launcher, and what flows between the parts.

    python docs/figures/scaling_out.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

COLORS = {
    "trainer": "#cfe3f7",
    "rollout": "#d9f2d0",
    "router": "#fde7c4",
    "env": "#f3d6ea",
    "epp": "#e5e0f7",
    "node": "#f7f7f7",
}
FLOWS = {"weights": "#1f5fa8", "K/V events": "#c77700", "episodes": "#a3337a", "requests": "#3b7d2c"}


def box(ax, x, y, w, h, text, color, size=8.5, bold=False):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=color, ec="#555",
                                lw=0.8))  # fmt: skip
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight="bold" if bold else None)


def node(ax, x, y, w, h, label):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.12", fc=COLORS["node"],
                                ec="#999", lw=1.0, ls="--"))  # fmt: skip
    ax.text(x + 0.08, y + h - 0.12, label, ha="left", va="top", fontsize=8, color="#555", style="italic")


def arrow(ax, a, b, flow, label=None, rad=0.0, both=False, at=None):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="<|-|>" if both else "-|>", mutation_scale=10, lw=1.4,
                                 color=FLOWS[flow], connectionstyle=f"arc3,rad={rad}"))  # fmt: skip
    if label:
        x, y = at or ((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.1)
        ax.text(x, y, label, fontsize=7, color=FLOWS[flow], ha="center")


def panel_torchrun(ax):
    ax.set_title("torchrun: training ranks on N nodes", fontsize=10, weight="bold")
    for i, (x, name) in enumerate(((0.2, "node 0 (--node-rank 0)"), (3.4, "node 1 (--node-rank 1)"))):
        node(ax, x, 1.4, 3.0, 3.2, name)
        for j in range(2):
            box(ax, x + 0.25 + j * 1.4, 3.1, 1.2, 0.9, f"rank {2 * i + j}\ntrainer\n+ engine", COLORS["trainer"])
        box(ax, x + 0.25, 1.7, 2.5, 0.8, "rollouts: the colocated engine\n(or rollout servers, shm / gloo)",
            COLORS["rollout"], size=7.5)  # fmt: skip
    arrow(ax, (3.05, 3.55), (3.65, 3.55), "weights", "gradients and\nshards: gloo /\nNCCL collectives",
          both=True, at=(3.3, 2.6))  # fmt: skip
    box(ax, 1.2, 0.2, 4.4, 0.75, "trainer.output_dir: one shared file system\n(checkpoints from every rank)",
        "#eeeeee", size=7.5)  # fmt: skip
    ax.plot([1.7, 2.4], [1.4, 0.95], color="#777", lw=1)
    ax.plot([4.9, 4.4], [1.4, 0.95], color="#777", lw=1)
    ax.text(3.3, 4.85, "rendezvous: --rdzv-endpoint HOST:PORT (c10d); Slurm: srun", fontsize=7.5, ha="center")


def panel_ray(ax):
    ax.set_title("Ray: every role an actor of one placement group", fontsize=10, weight="bold")
    node(ax, 0.2, 0.3, 3.0, 4.3, "Ray node A")
    node(ax, 3.5, 0.3, 3.0, 4.3, "Ray node B")
    box(ax, 0.5, 3.0, 2.4, 1.0, "trainer ranks\n(FSDP2; rank 0 publishes\nMASTER_ADDR:PORT)", COLORS["trainer"],
        size=7.5)  # fmt: skip
    box(ax, 0.5, 0.8, 2.4, 1.0, "env servers\n(vriksha env serve)", COLORS["env"], size=7.5)
    box(ax, 3.8, 3.0, 2.4, 1.0, "rollout servers\n(vriksha serve)", COLORS["rollout"], size=7.5)
    box(ax, 3.8, 0.8, 2.4, 1.0, "router\n(vriksha router)", COLORS["router"], size=7.5)
    arrow(ax, (2.9, 3.7), (3.8, 3.7), "weights", "weights (gloo; shm\non one node)")
    arrow(ax, (2.9, 3.2), (3.8, 1.3), "requests", None, rad=0.15)
    ax.text(3.05, 2.2, "/generate", fontsize=7, color=FLOWS["requests"])
    arrow(ax, (5.0, 1.8), (5.0, 3.0), "requests", None, both=True)
    arrow(ax, (5.3, 3.0), (5.3, 1.8), "K/V events", None)
    ax.text(5.4, 2.35, "KV events", fontsize=7, color=FLOWS["K/V events"])
    arrow(ax, (1.7, 3.0), (1.7, 1.8), "episodes", "episodes\n(reset / step)", both=True)
    ax.text(3.35, 4.85, "driver: restarts a dead service at its URL; the trainer re-syncs its weights", fontsize=7.5,
            ha="center")  # fmt: skip


def panel_k8s(ax):
    ax.set_title("Kubernetes: serving behind llm-d's endpoint picker", fontsize=10, weight="bold")
    box(ax, 0.3, 3.7, 2.2, 0.8, "Gateway\n+ HTTPRoute", "#eeeeee")
    box(ax, 3.0, 3.7, 3.2, 0.8, "endpoint picker (EPP)\nqueue, KV-cache, prefix scorers", COLORS["epp"], size=7.5)
    node(ax, 0.3, 0.3, 5.9, 2.9, "InferencePool vriksha-pool (selector vriksha.dev/pool)")
    for i in range(3):
        box(ax, 0.6 + i * 1.85, 0.7, 1.6, 1.3, f"vriksha serve\npod {i}\n/metrics: vllm:*", COLORS["rollout"],
            size=7.5)  # fmt: skip
    arrow(ax, (2.5, 4.1), (3.0, 4.1), "requests", None, both=True)
    arrow(ax, (1.4, 3.7), (1.4, 2.0), "requests", "requests", at=(1.0, 2.9))
    arrow(ax, (5.7, 2.0), (5.7, 3.7), "K/V events", "scrapes vllm:num_requests_waiting,\nvllm:kv_cache_usage_perc",
          at=(4.3, 3.3))  # fmt: skip
    ax.text(3.25, 2.35, "or: vriksha router as a Service (router.yaml);\nprefill -> K/V -> decode pods (pd.yaml)",
            fontsize=7, ha="center")  # fmt: skip


def main() -> None:
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.6))
    for ax, draw in zip(axes, (panel_torchrun, panel_ray, panel_k8s), strict=True):
        ax.set_xlim(0, 6.8)
        ax.set_ylim(0, 5.1)
        ax.axis("off")
        draw(ax)
    handles = [plt.Line2D([], [], color=c, lw=2, label=n) for n, c in FLOWS.items()]
    handles[1].set_label("K/V events, metrics")
    fig.legend(handles=handles, loc="lower center", ncol=4, frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    out = Path(__file__).with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
