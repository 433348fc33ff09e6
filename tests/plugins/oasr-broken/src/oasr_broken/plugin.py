raise RuntimeError("oasr-broken refuses to import")
