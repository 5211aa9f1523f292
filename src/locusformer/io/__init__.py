"""Readers and writers: the one owner of every file format passed between steps."""
