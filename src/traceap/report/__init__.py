"""Stage 7: reports people read (terminal, a self-contained HTML file, an annotated trace)."""
