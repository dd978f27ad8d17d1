"""How the control plane is built and served: the Runtime, the store, Ray and Serve's shared options."""
