from setuptools import find_packages, setup

package_name = "iws_world_model_ros"

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
    description="The world model as a ROS 2 robot: serves a trained checkpoint on a robot profile's topics.",
    license="MIT",
    entry_points={"console_scripts": ["world_model_node = iws_world_model_ros.node:main"]},
)
