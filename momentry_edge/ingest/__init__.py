"""Files in: the drop-folder watcher, registering files, the upload hook, the file guard."""
