"""Comparison: per-rank records into a measured Result, errors against the prediction (compare), rows' intervals
held out from the other configurations (held_out), and the HTML report (report)."""
