"""When a CPU counts as emulating a model dtype: one threshold, torch-free, read by the run (which measures the
ratio, :func:`kvlab.runtime.dtypes.matmul_time_ratio`) and by the reports (which warn about it)."""

# a model-dtype matmul taking more than this many times the float32 one means the CPU emulates the dtype
SLOW_DTYPE_RATIO = 2.0
