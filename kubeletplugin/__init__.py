"""The node agent: registration and DRA gRPC servers, prepare/unprepare, checkpoint, slice publisher."""
