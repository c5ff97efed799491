"""Rewrites within the npu level: npu-insert-sync."""
