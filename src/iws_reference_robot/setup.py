from setuptools import find_packages, setup

package_name = "iws_reference_robot"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + package_name]),
        ("share/" + package_name, ["package.xml"]),
    ],
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="iws developers",
    maintainer_email="iws@example.com",
    description="MuJoCo reference arm on a table with a top-down camera (push_t, rope, pile), served over the ROS interface of a ros2_control arm with a RealSense.",
    license="MIT",
    entry_points={"console_scripts": ["reference_robot_node = iws_reference_robot.node:main"]},
)
