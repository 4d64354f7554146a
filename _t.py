import warnings, copy, math; warnings.filterwarnings("ignore")
import os, tempfile; os.environ["ORETROFIT_CACHE_DIR"] = tempfile.mkdtemp()
import numpy as np, torch
from oretrofit.tabpfn import make_regressor, write_random_checkpoint, build_model, load_checkpoint, predict_batched
from oretrofit.hosts.tabpfn.estimators import in_memory_specs, vendor_class
from oretrofit import retrofit
d = tempfile.mkdtemp(); ck = write_random_checkpoint(d + "/tabpfn-v3-small.ckpt", "small", seed=0)
rng = np.random.default_rng(3)
sets = []
for n, m in ((60, 9), (150, 20), (90, 4)):
    x = rng.normal(size=(n + m, 5)); sets.append((x[:n], x[:n] @ rng.normal(size=5), x[n:]))
kw = dict(device="cpu", n_estimators=1, inference_precision=torch.float64)
r, res = make_regressor(ck, "oa", 1e-8, **kw)
m = build_model(load_checkpoint(ck))[0]; retrofit(m, "oa", 1e-8)
old = vendor_class("regressor")(model_path=in_memory_specs(ck, m, "regressor"), **kw)
each_new = [copy.copy(r).fit(a, b).predict(c) for a, b, c in sets]
each_old = [copy.copy(old).fit(a, b).predict(c) for a, b, c in sets]
print("loop new vs old", [float(np.abs(p - q).max()) for p, q in zip(each_new, each_old)], each_new[0].dtype, each_old[0].dtype)
r2, _ = make_regressor(ck, "oa", 1e-8, **kw)
bn = predict_batched(r2, *zip(*sets), max_padding=math.inf)
bo = predict_batched(old, *zip(*sets), max_padding=math.inf)
print("batched new vs old", [float(np.abs(p - q).max()) for p, q in zip(bn, bo)], bn[0].dtype, bo[0].dtype)
print("old batched vs old loop", [float(np.abs(p - q).max()) for p, q in zip(bo, each_old)])
