"""MJCF for the reference world: table, 3-joint SCARA arm with a pusher, top-down camera.

The XML is generated in Python so that the camera follows the robot profile (size, intrinsics) and
each task can add its own bodies. Everything the arm touches lies in the table plane (z = 0 is the
table top, the arm base sits at the table-frame origin), so objects only need planar joints (the
rope also slides in z so that its capsules rest on a hidden table plane with friction contacts).
"""
from __future__ import annotations

import math

from iws_common.profile import RobotProfile

# Arm geometry (metres). Links stay low (just above the objects) so that perspective keeps the
# whole arm in view; the pusher pokes above link 2 so the camera always sees its red top.
LINK1 = 0.24
LINK2 = 0.24
PUSHER_RADIUS = 0.015
PUSHER_BOTTOM = 0.003       # hovers just above the table
PUSHER_TOP = 0.062
LINK1_Z = 0.075
LINK2_Z = 0.05

# The camera looks straight down, centred over the workspace (not over the base) and high enough
# that the base, both links and the whole reach in front of the base stay in view.
CAMERA_CENTER = (0.0, 0.23)
CAMERA_HEIGHT = 0.79

# Collision classes: objects collide with each other and with the pusher; the rope collides with
# the pusher and with the table surface (TABLE_CONTACT, which touches nothing else), not with
# itself (cheaper); arm links and the visible table box collide with nothing.
OBJECT_CONTACT = 'contype="1" conaffinity="1"'
ROPE_CONTACT = 'contype="6" conaffinity="0"'
PUSHER_CONTACT = 'contype="1" conaffinity="3"'
TABLE_CONTACT = 'contype="0" conaffinity="4"'
NO_CONTACT = 'contype="0" conaffinity="0"'
# Geoms in this group exist for physics only: the renderer shows groups 0-2.
HIDDEN_GROUP = 3

# Colours with strong contrast on a light table (the images train a world model).
RGBA = {
    "table": "0.78 0.77 0.72 1",
    "arm": "0.25 0.25 0.3 1",
    "joint": "0.1 0.1 0.12 1",
    "pusher": "0.9 0.1 0.1 1",
    "wrist_mark": "1 1 1 1",
    "goal": "0.55 0.85 0.55 1",
    "object": "0.15 0.35 0.9 1",
    "object_alt": "0.65 0.2 0.8 1",
    "rope": "0.95 0.6 0.05 1",
}

TIMESTEP = 0.005


def camera_fovy_deg(profile: RobotProfile) -> float:
    """Vertical field of view that reproduces the profile's fy at the profile's image height."""
    cam = profile.camera
    return math.degrees(2.0 * math.atan(cam.height / 2.0 / cam.fy))


def _fmt(values) -> str:
    return " ".join(f"{v:.6g}" for v in values)


def arm_xml(profile: RobotProfile) -> str:
    """The arm: shoulder, elbow and wrist rotate about z; joint 0 points along +y (into the workspace)."""
    names = profile.joints.names
    lo, hi = profile.joints.lower, profile.joints.upper
    j = [f'range="{lo[i]:.6g} {hi[i]:.6g}" limited="true"' for i in range(3)]
    pusher_half = (PUSHER_TOP - PUSHER_BOTTOM) / 2
    return f"""
    <body name="base_link" pos="0 0 0" euler="0 0 1.5707963267948966">
      <geom name="base_column" type="cylinder" size="0.025 {LINK1_Z / 2:.4g}" pos="0 0 {LINK1_Z / 2:.4g}" rgba="{RGBA['joint']}" {NO_CONTACT}/>
      <body name="link1" pos="0 0 0">
        <joint name="{names[0]}" type="hinge" axis="0 0 1" {j[0]} damping="0.5" armature="0.02"/>
        <geom name="link1_geom" type="box" size="{LINK1 / 2:.4g} 0.011 0.006" pos="{LINK1 / 2:.4g} 0 {LINK1_Z:.4g}" rgba="{RGBA['arm']}" mass="0.6" {NO_CONTACT}/>
        <body name="link2" pos="{LINK1:.4g} 0 0">
          <joint name="{names[1]}" type="hinge" axis="0 0 1" {j[1]} damping="0.3" armature="0.01"/>
          <geom name="elbow_geom" type="cylinder" size="0.016 0.015" pos="0 0 {(LINK1_Z + LINK2_Z) / 2:.4g}" rgba="{RGBA['joint']}" mass="0.1" {NO_CONTACT}/>
          <geom name="link2_geom" type="box" size="{LINK2 / 2:.4g} 0.009 0.005" pos="{LINK2 / 2:.4g} 0 {LINK2_Z:.4g}" rgba="{RGBA['arm']}" mass="0.4" {NO_CONTACT}/>
          <body name="wrist" pos="{LINK2:.4g} 0 0">
            <joint name="{names[2]}" type="hinge" axis="0 0 1" {j[2]} damping="0.05" armature="0.005"/>
            <geom name="pusher" type="cylinder" size="{PUSHER_RADIUS} {pusher_half:.4g}" pos="0 0 {PUSHER_BOTTOM + pusher_half:.4g}" rgba="{RGBA['pusher']}" mass="0.1" friction="0.4 0.005 0.0001" {PUSHER_CONTACT}/>
            <geom name="wrist_mark" type="box" size="0.013 0.003 0.001" pos="0 0 {PUSHER_TOP + 0.001:.4g}" rgba="{RGBA['wrist_mark']}" mass="0.001" {NO_CONTACT}/>
          </body>
        </body>
      </body>
    </body>"""


def actuators_xml(profile: RobotProfile) -> str:
    """Stiff, damped position servos: settle well within one 10 Hz period."""
    gains = ((120, 6), (80, 3.5), (5, 0.2))
    lines = []
    for name, lo, hi, (kp, kv) in zip(profile.joints.names, profile.joints.lower, profile.joints.upper, gains):
        lines.append(f'<position name="{name}_servo" joint="{name}" kp="{kp}" kv="{kv}" ctrlrange="{lo:.6g} {hi:.6g}" ctrllimited="true"/>')
    return "\n    ".join(lines)


def build_scene_xml(profile: RobotProfile, task_bodies: str = "", goal_marker: str = "") -> str:
    """The whole world as an MJCF string; task_bodies/goal_marker are worldbody fragments."""
    if profile.joints.count != 3:
        raise ValueError(f"the reference scene has 3 joints, profile {profile.name} has {profile.joints.count}")
    cam = profile.camera
    cx, cy = CAMERA_CENTER
    return f"""<mujoco model="iws_reference_{profile.name}">
  <compiler angle="radian"/>
  <option timestep="{TIMESTEP}" integrator="implicitfast" gravity="0 0 -9.81" cone="pyramidal">
    <flag energy="disable"/>
  </option>
  <visual>
    <global offwidth="{max(cam.width, 64)}" offheight="{max(cam.height, 64)}"/>
    <headlight ambient="0.35 0.35 0.35" diffuse="0.25 0.25 0.25" specular="0 0 0"/>
    <quality shadowsize="0" numslices="10" numstacks="3" numquads="1"/>
  </visual>
  <default>
    <geom solref="0.02 1" solimp="0.95 0.99 0.001"/>
  </default>
  <worldbody>
    <light name="sun" directional="true" pos="0 0 2" dir="0 0 -1" diffuse="0.4 0.4 0.4" specular="0 0 0" castshadow="false"/>
    <geom name="table" type="box" size="0.5 0.5 0.02" pos="{cx} {cy} -0.02" rgba="{RGBA['table']}" {NO_CONTACT}/>
    <camera name="top" pos="{cx} {cy} {CAMERA_HEIGHT}" xyaxes="1 0 0 0 1 0" fovy="{camera_fovy_deg(profile):.6g}"/>
    {goal_marker}
    {arm_xml(profile)}
    {task_bodies}
  </worldbody>
  <actuator>
    {actuators_xml(profile)}
  </actuator>
</mujoco>
"""
