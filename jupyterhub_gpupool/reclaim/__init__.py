"""The idle-GPU reclaimer (``jupyterhub-gpupool reclaimer``): the pool decides, this sees and acts.

``core`` is the async core (one round: lead, observe, post, act), ``actions`` its hands (save,
stop, restart), ``metrics`` its counters, ``hooks`` an example ``notify_hook``, ``app`` the
traitlets application. It talks HTTP only: the pool through ``poolclient``, the hub and the
users' servers through ``hubclient``; it never imports the store or the service.
"""
