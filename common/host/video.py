"""Videos of one episode: GIFs drawn with gymnax's own renderers (`gymnax.visualize`, through
matplotlib; classic control also needs gymnasium's pygame renderer, MinAtar needs seaborn),
and for Brax and MuJoCo Playground environments an HTML page that plays the episode in a
browser (Brax's own viewer, `brax.io.html`: no extra package). The optional packages are imported only here, and
`check_renderer` says which are missing before anything is drawn.
"""

import importlib.util

import numpy as np

_CLASSIC = ("gymnasium", "pygame")
RENDERERS = {
    **dict.fromkeys(("CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCar-v0",
                     "MountainCarContinuous-v0"), _CLASSIC),
    **dict.fromkeys(("Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar",
                     "Seaquest-MinAtar", "SpaceInvaders-MinAtar", "Pong-misc"), ("seaborn",)),
    **dict.fromkeys(("Catch-bsuite", "PointRobot-misc", "MetaMaze-misc", "FourRooms-misc"), ()),
}
"""gymnax 1.0's renderers (`gymnax.visualize.Visualizer`): env id -> what they import besides
matplotlib."""
_INSTALL = {"matplotlib": "pip install -e '.[bench]'", "gymnasium": "pip install "
            "'gymnasium[classic-control]'", "pygame": "pip install 'gymnasium[classic-control]'",
            "seaborn": "pip install seaborn"}


def check_renderer(env_id: str, path: str = "episode.gif"):
    """Raise `ValueError` (one line) unless a video of `env_id` can be drawn here into `path`
    (a GIF; for a Brax environment an `.html` page)."""
    from common.maskedenv import MASKED

    if env_id.startswith(("brax/", "playground/")):
        if not path.lower().endswith(".html"):
            raise ValueError(f"--capture-video for {env_id} writes an HTML page (Brax's "
                             f"viewer); name it *.html, not {path!r}.")
        return
    if not path.lower().endswith(".gif"):
        raise ValueError(f"--capture-video for {env_id} writes a GIF (gymnax's renderer); "
                         f"name it *.gif, not {path!r}.")
    env_id = MASKED.get(env_id, (env_id,))[0]  # a masked task looks like the task it masks
    if env_id not in RENDERERS:
        raise ValueError(f"--capture-video: gymnax has no renderer for {env_id!r}, so no GIF can "
                         f"be made of it (it has renderers for {', '.join(RENDERERS)}).")
    missing = [m for m in ("matplotlib", *RENDERERS[env_id]) if importlib.util.find_spec(m) is None]
    if missing:
        fixes = " and ".join(dict.fromkeys(_INSTALL[m] for m in missing))
        raise ValueError(f"--capture-video for {env_id} needs {', '.join(missing)} "
                         f"(not installed): {fixes}.")


def save_gif(env, env_params, states, rewards, path: str):
    """Draw gymnax states (a list, one per frame) into a GIF with `gymnax.visualize`."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    from gymnax.visualize import Visualizer

    Visualizer(env, env_params, states, np.cumsum(rewards)).animate(path)


def save_video(env_id: str, env, env_params, states, rewards, path: str):
    """Save one episode (states and rewards, one per frame) as `check_renderer` allowed: an
    HTML page for a Brax or Playground environment (Brax's viewer), a GIF otherwise."""
    if env_id.startswith(("brax/", "playground/")):
        if env_id.startswith("brax/"):
            from common.braxenv import render_html
        else:
            from common.playgroundenv import render_html

        page = render_html(env, states)  # drawn first: the file is written in one go
        with open(path, "w") as f:
            f.write(page)
    else:
        save_gif(env, env_params, states, rewards, path)
