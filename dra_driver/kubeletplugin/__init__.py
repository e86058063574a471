"""kubelet plugin plumbing: sockets, registration, DRA and health gRPC services."""
