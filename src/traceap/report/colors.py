"""One colour per pattern id, shared by the HTML report and the terminal."""

#: Okabe-Ito first: readable by colour-blind readers.
PATTERN_COLORS = {
    "single_process_dataloading": "#E69F00",
    "no_pin_memory": "#56B4E9",
    "excessive_memcpy": "#009E73",
    "graph_break": "#CC79A7",
    "cpu_bound": "#D55E00",
    "small_nccl_kernels": "#0072B2",
    "nccl_blocks_compute_stream": "#8F6D00",
    "nccl_compute_no_overlap": "#6A3D9A",
}

#: Terminals draw the two dark hues too dim on a dark background: lighter ones, same hue, and
#: colours for the cross-rank findings that only the terminal colours by name.
TERMINAL_COLORS = {
    **PATTERN_COLORS,
    "nccl_blocks_compute_stream": "#C9A227",
    "nccl_compute_no_overlap": "#9B6BD0",
    "straggler": "#FF5555",
    "rank_imbalance": "#FF8888",
}

#: One colour per GPU idle cause (`traceap.idle.CAUSES`): the hue of the pattern that owns the
#: cause, grey for warm-up, pale for what no cause explains.
CAUSE_COLORS = {
    "warmup": "#9AA5B1",
    "communication": PATTERN_COLORS["nccl_compute_no_overlap"],
    "compile_gaps": PATTERN_COLORS["graph_break"],
    "host_copy_sync": PATTERN_COLORS["excessive_memcpy"],
    "data_loading": PATTERN_COLORS["single_process_dataloading"],
    "launch_bound": PATTERN_COLORS["cpu_bound"],
    "not_explained": "#D9DEE4",
}
#: The GPU's busy time, drawn beside the idle causes.
BUSY_COLOR = "#3B4A5A"
TERMINAL_CAUSE_COLORS = {**CAUSE_COLORS, "communication": TERMINAL_COLORS["nccl_compute_no_overlap"],
                         "not_explained": "#8A939C", "busy": "#5F7A94"}
