# SPDX-License-Identifier: Apache-2.0
# Dependencies come from the system (Debian: libeigen3-dev, nlohmann-json3-dev); nothing is
# downloaded at configure time. scripts/install-deps.sh installs what is missing.
find_package(Threads REQUIRED)
find_package(Eigen3 3.4 QUIET NO_MODULE)
if(NOT Eigen3_FOUND)
  message(FATAL_ERROR "diffusion_gemma needs Eigen >= 3.4 (Debian: apt-get install libeigen3-dev, "
                      "or run scripts/install-deps.sh)")
endif()
find_package(nlohmann_json 3.11 QUIET)
if(NOT nlohmann_json_FOUND)
  message(FATAL_ERROR "diffusion_gemma needs nlohmann_json >= 3.11 (Debian: apt-get install nlohmann-json3-dev, "
                      "or run scripts/install-deps.sh)")
endif()
