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
