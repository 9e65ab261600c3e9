from setuptools import find_packages, setup

package_name = "iws_common"

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
    description="Light helpers shared by every iws node and tool: robot profiles, joint-command rules, image conversion, QoS presets. No torch, no MuJoCo.",
    license="MIT",
    entry_points={"console_scripts": []},
)
