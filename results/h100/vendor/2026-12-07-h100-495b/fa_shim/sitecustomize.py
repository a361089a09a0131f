import importlib.util, sys
spec = importlib.util.spec_from_file_location('flash_attn.cute.bench_utils', '/tmp/vendor/vendor_bench/flash-attention/flash_attn/cute/bench_utils.py')
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
sys.modules['flash_attn.cute.bench_utils'] = module
