"""kubelet gRPC APIs (.proto sources) and the Python code generated from them by proto/generate.py."""
