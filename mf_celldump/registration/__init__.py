"""Files MindFormers loads by path through ``--register_path`` + ``auto_register``.

``mf-celldump register-path`` prints this directory. Importing this package does nothing.
"""
