"""Comparison: per-rank records into a measured Result, errors against the prediction (compare), and the HTML report (report)."""
