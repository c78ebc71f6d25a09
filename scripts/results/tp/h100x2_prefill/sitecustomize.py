import faulthandler, os, sys
_s = int(os.environ.get("DIAG_DUMP_S", "0"))
if _s:
    faulthandler.dump_traceback_later(_s, repeat=True, file=sys.stderr)
