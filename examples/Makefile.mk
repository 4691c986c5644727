# examples/: built against the installed library by tests/lib/install.sh
