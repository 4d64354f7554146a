"""Built-in hosts, one module or package per host: everything one host knows (its sites, its
I/O, the releases it admits, its contracts) lives in its folder.

    torch_nn.py      plain torch.nn layers (the fallback host)
    transformers/    transformers models routed through the attention interface
    tabpfn/          TabPFN v3: sites, checkpoints, estimators, patched artifacts
    tabdpt/          TabDPT: sites, checkpoints, estimators, the padded forward
    tabicl/          TabICL: sites, estimators, token boundaries
    mitra/           Mitra (autogluon.tabular): sites, checkpoints, estimators, the padded
                     forward; its package is also its public entry point

Importing this package registers nothing: :func:`oretrofit.registered_hosts` imports the host
modules named in :data:`oretrofit._surgery.host.BUILTIN_HOSTS` on first use. A host imports the core
(``oretrofit._*``) and :mod:`oretrofit.hosts.torch_nn`, never the runners, the CLI or another
host.
"""
