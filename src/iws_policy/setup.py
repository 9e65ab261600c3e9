from setuptools import find_packages, setup

package_name = "iws_policy"

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
    description="Diffusion Policy (image + joint state -> joint command chunk) trained on iws datasets, its ROS node, and evaluation through ROS on either backend.",
    license="MIT",
    entry_points={"console_scripts": []},
)
