
a
gpu-node-017$9d1c0b6e-4a51-4c1e-8c55-3f1d7e2a0b170.1.0"$0f3c2a9e-6d1b-4f5e-9a7c-2b8d4e6f1a3c