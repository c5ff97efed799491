// RUN: python -m tilecc.passes.npu.collectives --chips 2 --rank 1 --elements 8 | filecheck %s --check-prefix=TWO
// RUN: python -m tilecc.passes.npu.collectives --chips 3 --rank 0 --elements 12 --chunks 2 | filecheck %s --check-prefix=THREE

// The chunked ring all-reduce of passes/npu/collectives.py, chip `rank`'s link transfers
// (x at 0x0, y at 0x1000; sends on l0 signal s0, receives on l1 signal s1).

// Two chips, chip 1: it sends its block 0 of x, receives block 1 summed on write into y,
// forwards the sum once received, and receives block 0 of the sum.
// TWO:      link.send l0 hbm[0x0 rs=4 cs=1]:f32 -> chip0:f32 1x4 signal(s0)
// TWO-NEXT: link.recv l1 chip0:f32 + hbm[0x10 rs=4 cs=1]:f32 -> hbm[0x1010 rs=4 cs=1]:f32 1x4 signal(s1)
// TWO-NEXT: link.send l0 hbm[0x1010 rs=4 cs=1]:f32 -> chip0:f32 1x4 wait(s1>=1) signal(s0)
// TWO-NEXT: link.recv l1 chip0:f32 -> hbm[0x1000 rs=4 cs=1]:f32 1x4 signal(s1)
// TWO-NOT:  link

// Three chips, chip 0, two chunks per block: reduce-scatter sends block 2 from x (both
// chunks), then block 1 of y, each chunk waiting only for its own receive; chip 0 ends
// the reduce-scatter with block 0 summed; the all-gather forwards block 0, then block 2;
// its receive into block 1 waits for the reduce-scatter send that read it (s0).
// THREE:      link.send l0 hbm[0x20 rs=2 cs=1]:f32 -> chip1:f32 1x2 signal(s0)
// THREE-NEXT: link.recv l1 chip2:f32 + hbm[0x10 rs=2 cs=1]:f32 -> hbm[0x1010 rs=2 cs=1]:f32 1x2 signal(s1)
// THREE-NEXT: link.send l0 hbm[0x28 rs=2 cs=1]:f32 -> chip1:f32 1x2 signal(s0)
// THREE-NEXT: link.recv l1 chip2:f32 + hbm[0x18 rs=2 cs=1]:f32 -> hbm[0x1018 rs=2 cs=1]:f32 1x2 signal(s1)
// THREE-NEXT: link.send l0 hbm[0x1010 rs=2 cs=1]:f32 -> chip1:f32 1x2 wait(s1>=1) signal(s0)
// THREE-NEXT: link.recv l1 chip2:f32 + hbm[0x0 rs=2 cs=1]:f32 -> hbm[0x1000 rs=2 cs=1]:f32 1x2 signal(s1)
// THREE-NEXT: link.send l0 hbm[0x1018 rs=2 cs=1]:f32 -> chip1:f32 1x2 wait(s1>=2) signal(s0)
// THREE-NEXT: link.recv l1 chip2:f32 + hbm[0x8 rs=2 cs=1]:f32 -> hbm[0x1008 rs=2 cs=1]:f32 1x2 signal(s1)
// THREE-NEXT: link.send l0 hbm[0x1000 rs=2 cs=1]:f32 -> chip1:f32 1x2 wait(s1>=3) signal(s0)
// THREE-NEXT: link.recv l1 chip2:f32 -> hbm[0x1020 rs=2 cs=1]:f32 1x2 signal(s1)
// THREE-NEXT: link.send l0 hbm[0x1008 rs=2 cs=1]:f32 -> chip1:f32 1x2 wait(s1>=4) signal(s0)
// THREE-NEXT: link.recv l1 chip2:f32 -> hbm[0x1028 rs=2 cs=1]:f32 1x2 signal(s1)
// THREE-NEXT: link.send l0 hbm[0x1020 rs=2 cs=1]:f32 -> chip1:f32 1x2 wait(s1>=5) signal(s0)
// THREE-NEXT: link.recv l1 chip2:f32 -> hbm[0x1010 rs=2 cs=1]:f32 1x2 wait(s0>=3) signal(s1)
// THREE-NEXT: link.send l0 hbm[0x1028 rs=2 cs=1]:f32 -> chip1:f32 1x2 wait(s1>=6) signal(s0)
// THREE-NEXT: link.recv l1 chip2:f32 -> hbm[0x1018 rs=2 cs=1]:f32 1x2 wait(s0>=4) signal(s1)
