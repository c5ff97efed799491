"""Rewrites within the tile level: plan-sram and plan-hbm (memory planning)."""
