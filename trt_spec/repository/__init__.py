"""The Triton model repository a plan becomes: ``config.pbtxt`` builders (Triton's own protobuf)
and the writer, which copies the runtime package beside each python model."""
