"""Built-in host patch sets, one module per host; importing this package registers them."""
from . import tabpfn_v3  # noqa: F401,E402
from . import transformers_bert  # noqa: F401,E402
from . import transformers_llama  # noqa: F401,E402
from . import torch_nn  # noqa: F401,E402  (generic fallback: keep it last)
