"""Node-local persistent state: the checkpoint, atomic files and the cross-process lock."""
