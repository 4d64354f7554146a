"""Built-in host patch sets, one module per host; importing this package registers them."""
