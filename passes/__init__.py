"""tilecc's passes: graph rewrites, lowerings between levels, planning, scheduling.

Every pass is an xDSL `ModulePass` with a kebab-case name (so a pipeline is a string,
`tilecc-opt -p 'lower-graph-to-tile{target=tiny},plan-sram{target=tiny}'`) and a plain
function taking the hardware config, which the compiler driver calls directly.
"""
