"""podium C++ layer host"""



def zygote_serve(fd: int) -> tuple:
    """
    Serves fork requests on `fd` until the controller closes it (then raises CoreError). Returns (argv, env, cwd) in each forked child.
    """
