"""The Gluon kernels for Hopper (sm_90): what they share (sm90.py), the forward (forward.py, its
launcher forward_launch.py and its persistent schedule persistent.py), the backward's dK/dV kernel
(backward.py; head dim 256: backward_wide.py), its dQ kernel (backward_dq.py) and their launchers
(backward_launch.py), and the kernels' own instrumentation (trace.py). Their configs are in
flashtune/configs/gluon.py."""
