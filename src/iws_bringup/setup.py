from glob import glob

from setuptools import find_packages, setup

package_name = "iws_bringup"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + package_name]),
        ("share/" + package_name, ["package.xml"]),
        ("share/" + package_name + "/launch", glob("launch/*.launch.py")),
    ],
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="iws developers",
    maintainer_email="iws@example.com",
    description="Launch files and the iws command line: start the reference robot, the world model or nothing (real hardware) on a robot profile's topics.",
    license="MIT",
    entry_points={"console_scripts": ["iws = iws_bringup.cli:main", "command_fanout = iws_bringup.fanout:main"]},
)
