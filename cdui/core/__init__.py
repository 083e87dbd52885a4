"""The foundation every process shares: errors, the clock, paths and the file layout, the settings
table, atomic writes, private modes, exit codes, certificate trust. Imports nothing of cdui above
it.
"""
