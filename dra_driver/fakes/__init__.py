"""Stand-ins for what a dev machine lacks (a kubelet, an API server), used by the
demo, the benchmarks and the tests. They speak the same interfaces as the real
thing: the kubelet-like client talks real gRPC over real unix sockets."""
